"""Launcher detection and the singleton guard, from environment dictionaries."""

import pytest

from hpcddp.env import SingletonLaunchError, check_not_singleton, detect_launcher

HYDRA = {"PMI_SIZE": "4", "PMI_RANK": "1", "PMI_FD": "9", "MPI_LOCALNRANKS": "4"}
SRUN_NONE = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}
SRUN_PMI2 = dict(SRUN_NONE, PMI_FD="5", PMI_SIZE="2", PMI_RANK="0")
SRUN_PMIX = dict(SRUN_NONE, PMIX_RANK="0", PMIX_NAMESPACE="slurm.pmix.1.0")
OMPI = {"OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_RANK": "3", "PMIX_RANK": "3"}


@pytest.mark.parametrize("environ, name, size", [
    ({}, "none", None),
    (HYDRA, "mpiexec (Hydra)", 4),
    (SRUN_NONE, "srun --mpi=none", 2),
    (SRUN_PMI2, "srun --mpi=pmi2", 2),
    (SRUN_PMIX, "srun --mpi=pmix", 2),
    (OMPI, "mpirun (Open MPI)", 8),
    # Hydra inside an allocation bootstraps through srun: both kinds of variable.
    (dict(SRUN_NONE, **HYDRA), "mpiexec (Hydra)", 4),
    ({"MV2_COMM_WORLD_SIZE": "3"}, "mpirun_rsh (MVAPICH)", 3),
])
def test_detects_launcher_and_its_size(environ, name, size):
    launcher = detect_launcher(environ)
    assert launcher.name == name
    assert launcher.world_size == size


def test_srun_without_pmi_is_a_singleton_error_naming_the_fix():
    with pytest.raises(SingletonLaunchError) as info:
        check_not_singleton(1, SRUN_NONE)
    message = str(info.value)
    assert "SLURM_STEP_NUM_TASKS=2" in message
    assert "srun --mpi=pmi2" in message and "--mpi=pmix" in message


def test_srun_with_pmi_that_mpi_ignored_does_not_advise_that_same_plugin():
    with pytest.raises(SingletonLaunchError) as info:
        check_not_singleton(1, SRUN_PMI2)
    message = str(info.value)
    assert "srun did wire up MPI (--mpi=pmi2), but this MPI library did not use it" in message
    assert "use `srun --mpi=pmi2`" not in message and "MPI.Get_library_version()" in message


def test_mpirun_of_another_mpi_is_a_singleton_error():
    with pytest.raises(SingletonLaunchError, match="OMPI_COMM_WORLD_SIZE=8.*different MPI"):
        check_not_singleton(1, OMPI)


@pytest.mark.parametrize("mpi_size, environ", [
    (1, {}),                                              # plain `python train.py`
    (1, {"SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"}),      # serial command inside sbatch
    (1, dict(SRUN_NONE, SLURM_STEP_NUM_TASKS="1")),       # srun -n 1
    (2, SRUN_PMI2),                                       # a working srun step
    (4, HYDRA),
])
def test_no_error_when_mpi_agrees_with_the_launcher(mpi_size, environ):
    check_not_singleton(mpi_size, environ)
