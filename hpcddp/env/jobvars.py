"""The variables that place a process inside a launcher's job.

A process started from inside a rank (the CUDA self-test, a test's job, a DataLoader
worker's helper) inherits them, and an MPI library that finds them tries to join the
job as one of its ranks. ``clean_environment`` drops exactly those and keeps the rest,
the user's and the site's MPI settings above all (``OMPI_MCA_plm=isolated``,
``MV2_USE_CUDA=1``, ``MPICH_GPU_SUPPORT_ENABLED=1``): without them a new process would
run another MPI set-up than the job's. torchrun's variables, which ``init()`` exports for
its rank (``hpcddp.env.torchrun``), are dropped too.
"""

from typing import Dict, Mapping

from hpcddp.env.torchrun import TORCHRUN_VARIABLES

__all__ = ["clean_environment", "in_job"]

_JOB_PREFIXES = ("PMI_", "PMI2_", "PMIX_", "OMPI_COMM_WORLD_", "OMPI_UNIVERSE_", "OMPI_FIRST_",
                 "OMPI_APP_", "OMPI_NUM_", "OMPI_FILE_", "OMPI_ARGV", "OMPI_COMMAND",
                 "SLURM_STEP", "SLURM_PROCID", "SLURM_LOCALID", "MPI_LOCAL", "HYDRA_",
                 "I_MPI_HYDRA", "PALS_", "PRTE_")
# Open MPI's launcher also passes the job to its ranks as MCA parameters.
_JOB_MCA = ("orte_", "ess", "pmix", "prte", "initial_wdir", "shmem_RUNTIME", "rmaps_",
            "ras_", "routed", "rml", "oob", "grpcomm", "odls", "state_", "errmgr", "iof")


def in_job(name: str) -> bool:
    """Whether the variable ``name`` ties a process to the launcher's job."""
    if name in TORCHRUN_VARIABLES:  # init() exported them for this rank alone
        return True
    if name.startswith("PMIX_MCA_"):
        return False
    if name.startswith("OMPI_MCA_"):
        return name[len("OMPI_MCA_"):].startswith(_JOB_MCA)
    return name.startswith(_JOB_PREFIXES)


def clean_environment(environ: Mapping[str, str]) -> Dict[str, str]:
    """``environ`` without the variables that would make a new MPI process join the job."""
    return {k: v for k, v in environ.items() if not in_job(k)}
