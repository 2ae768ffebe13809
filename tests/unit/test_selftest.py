"""Judging the two-process device-buffer self-test. Stand-in launchers print what a job
on a GPU would; the same checks run as real jobs on host buffers in
tests/jobs/test_selftest_jobs.py, and on device buffers on a GPU machine
(tests/mpi/test_world.py)."""

import os
import signal
import sys

import pytest

from hpcddp.startup import mpi_library as library
from hpcddp.startup import selftest
from hpcddp.startup.selftest import DeviceVerdict, SelfTest, pair_launcher, run_pair_check
from hpcddp.env import clean_environment


def _launcher(code):
    """A stand-in for ``mpiexec -n 2``: Python running ``code``, which prints what the two
    processes of a real job would (the program and its arguments follow, unused)."""
    return [sys.executable, "-c", code]


def _says(*lines):
    return _launcher("; ".join(f"print({line!r})" for line in lines))


OK = "hpcddp-pair-check p2p ok"


def test_both_processes_right_passes():
    result = run_pair_check(_says(OK, OK), "p2p")
    assert result.passed and "Isend/Irecv" in result.reason


def test_a_wrong_value_on_one_process_fails_and_quotes_it():
    result = run_pair_check(_says(OK, "hpcddp-pair-check p2p gave 0.0 at element 0, not 2.0"),
                            "p2p")
    assert not result.passed and "gave 0.0 at element 0, not 2.0" in result.reason


def test_a_world_that_is_not_two_processes_fails():
    # A launcher of another MPI starts two singletons: each sees a world of 1.
    said = "hpcddp-pair-check iallreduce ran in a world of 1, not 2: the launcher is not this MPI's"
    result = run_pair_check(_says(said, said), "iallreduce")
    assert not result.passed and "not this MPI's" in result.reason


def test_segfault_error_and_hang_are_failures_not_crashes():
    crash = run_pair_check(_launcher(f"import os; print({OK!r}, flush=True); "
                                     f"os.kill(os.getpid(), {int(signal.SIGSEGV)})"), "p2p")
    assert not crash.passed and "died of signal 11" in crash.reason
    error = run_pair_check(_launcher("raise SystemExit('cudaErrorNoDevice')"), "p2p")
    assert not error.passed and "exit 1" in error.reason and "cudaErrorNoDevice" in error.reason
    hang = run_pair_check(_launcher("import time; time.sleep(30)"), "p2p", timeout=1)
    assert not hang.passed and "hung" in hang.reason
    one = run_pair_check(_says(OK), "p2p")  # the other process said nothing
    assert not one.passed


def test_the_verdict_picks_the_reduction():
    good, bad = SelfTest(True, "passed"), SelfTest(False, "died of signal 11")
    assert DeviceVerdict(good, good, 1.0).reduction == "mpi"
    assert DeviceVerdict(good, bad, 1.0).reduction == "ring"  # Open MPI's libnbc crash
    assert DeviceVerdict(bad, good, 1.0).reduction == "staged"
    assert DeviceVerdict(bad, bad, 1.0).reduction == "staged"
    assert "ring on device buffers" in DeviceVerdict(good, bad, 2.5).describe()
    assert "(2.5 s)" in DeviceVerdict(good, bad, 2.5).describe()


def test_launcher_and_scheduler_variables_do_not_reach_the_job(monkeypatch):
    monkeypatch.setenv("PMI_SIZE", "4")
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "4")
    monkeypatch.setenv("SLURM_JOB_ID", "7")  # the launcher would ask Slurm for nodes
    monkeypatch.setenv("OMPI_MCA_pml", "ucx")  # a setting: kept
    code = ("import os; ok = not any(k in os.environ for k in ('PMI_SIZE', "
            "'SLURM_STEP_NUM_TASKS', 'SLURM_JOB_ID')) and os.environ.get('OMPI_MCA_pml') "
            f"== 'ucx'; print(*[{OK!r} if ok else 'no'] * 2, sep=chr(10))")
    assert run_pair_check(_launcher(code), "p2p").passed


def test_the_launcher_is_the_setting_or_the_mpiexec_beside_python(monkeypatch, tmp_path):
    assert pair_launcher("mpirun --oversubscribe") == ["mpirun", "--oversubscribe", "-n", "2"]
    monkeypatch.setattr(selftest, "launcher_of_loaded_mpi", lambda: None)  # none loaded
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        assert pair_launcher() == [beside, "-n", "2"]
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="HPCDDP_SELFTEST_LAUNCHER"):
        pair_launcher()


def test_the_loaded_mpis_own_launcher_comes_before_the_one_beside_python(monkeypatch,
                                                                          tmp_path):
    # A CUDA-aware Open MPI loaded through LD_LIBRARY_PATH in a virtual environment that
    # also holds the mpich wheel's mpiexec: hydra would start two singletons of it.
    prefix = tmp_path / "openmpi"
    (prefix / "lib").mkdir(parents=True)
    (prefix / "bin").mkdir()
    (prefix / "lib" / "libmpi.so.40.30.4").write_bytes(b"")
    (prefix / "lib" / "libmpi.so.40").symlink_to("libmpi.so.40.30.4")
    (prefix / "bin" / "mpirun").write_text("#!/bin/sh\n")
    (prefix / "bin" / "mpirun").chmod(0o755)
    monkeypatch.setattr(library, "mapped_mpi_libraries",
                        lambda: [str(prefix / "lib" / "libmpi.so.40")])
    assert pair_launcher() == [str(prefix / "bin" / "mpirun"), "-n", "2"]
    (prefix / "bin" / "mpirun").unlink()  # an installation without its launcher
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="HPCDDP_SELFTEST_LAUNCHER"):
        pair_launcher()


def test_this_process_maps_the_library_mpi4py_loaded():
    from mpi4py import MPI
    found = library.mapped_mpi_libraries()
    # The library MPI itself names (MPICH's or Open MPI's) is among the files mapped.
    assert found and all(os.path.isfile(f) for f in found)
    kind = "libmpi.so.40" if MPI.Get_library_version().startswith("Open MPI") else "libmpi"
    assert any(os.path.basename(f).startswith(kind) for f in found)
    launcher = library.launcher_of_loaded_mpi()
    assert launcher is None or os.access(launcher, os.X_OK)
    line = library.library_version_line()  # Open MPI's string ends with a NUL
    assert line == MPI.Get_library_version().splitlines()[0].strip(" \x00") and "\x00" not in line


def test_job_variables_go_and_mpi_settings_stay():
    # Open MPI 4 under mpirun in a container (as seen on the GPU test machine), Hydra, Slurm.
    job = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_MCA_orte_hnp_uri": "1.0;tcp://10.0.0.1:4000", "OMPI_MCA_ess": "^singleton",
           "OMPI_MCA_ess_base_jobid": "123", "OMPI_MCA_pmix": "^s1,s2", "PMIX_RANK": "1",
           "PMIX_NAMESPACE": "prterun-1", "PMIX_SERVER_URI41": "x", "PMI_FD": "5",
           "PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "SLURM_STEP_ID": "0",
           "SLURM_PROCID": "1", "PALS_RANKID": "1"}
    settings = {"OMPI_MCA_plm": "isolated", "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
                "PMIX_MCA_gds": "hash", "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_pml": "ucx",
                "MV2_USE_CUDA": "1", "MPICH_GPU_SUPPORT_ENABLED": "1",
                "MPIR_CVAR_ENABLE_GPU": "1", "UCX_TLS": "cuda,sm", "SLURM_JOB_ID": "7",
                "CUDA_VISIBLE_DEVICES": "0", "PATH": "/usr/bin"}
    assert clean_environment({**job, **settings}) == settings
