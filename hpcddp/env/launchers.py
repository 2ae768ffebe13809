"""Which launcher started this process, and how many processes it says it started.

hpcddp takes rank, size and local rank from MPI itself. Launcher variables serve one
purpose: noticing when the launcher started N processes but MPI sees a world of one,
which is how a missing PMI wire-up (``srun --mpi=none``) or an mpi4py linked to another
MPI than the ``mpirun`` in use shows up. Only step-level variables are read: the
allocation-level ``SLURM_NTASKS`` is also set for a serial command inside a multi-task
``sbatch``, which must still run.
"""

import os
from typing import Mapping, Optional

__all__ = [
    "LAUNCHERS",
    "Launcher",
    "SingletonLaunchError",
    "check_not_singleton",
    "detect_launcher",
]


class SingletonLaunchError(RuntimeError):
    """The launcher started several processes but each one is an MPI world of one."""


def _int(environ: Mapping[str, str], key: str) -> Optional[int]:
    try:
        return int(environ[key])
    except (KeyError, ValueError):
        return None


class Launcher:
    """A launcher that this process may have been started by.

    Subclasses set ``size_var`` (the variable holding the number of processes started)
    and implement ``detect()``.
    """

    name = "none"
    size_var: Optional[str] = None
    fix = "start the job with your MPI's mpiexec or with srun --mpi=pmi2/pmix"

    def __init__(self, environ: Optional[Mapping[str, str]] = None):
        self.environ = dict(os.environ if environ is None else environ)

    def detect(self) -> bool:
        return False

    @property
    def world_size(self) -> Optional[int]:
        """The number of processes the launcher says it started, or None if unknown."""
        return _int(self.environ, self.size_var) if self.size_var else None

    def describe(self) -> str:
        size = self.world_size
        return self.name if size is None else f"{self.name} ({self.size_var}={size})"


class OpenMPI(Launcher):
    name = "mpirun (Open MPI)"
    size_var = "OMPI_COMM_WORLD_SIZE"
    fix = ("mpi4py is linked to a different MPI than this mpirun: launch with the mpiexec "
           "of mpi4py's MPI, or rebuild mpi4py against Open MPI with "
           "`pip install --no-binary mpi4py mpi4py`")

    def detect(self):
        return self.size_var in self.environ


class Hydra(Launcher):
    """MPICH's and Intel MPI's ``mpiexec``; also when it bootstraps through Slurm."""

    name = "mpiexec (Hydra)"
    size_var = "PMI_SIZE"
    fix = ("mpi4py is linked to a different MPI than this mpiexec: launch with the mpiexec "
           "of mpi4py's MPI, or rebuild mpi4py with `pip install --no-binary mpi4py mpi4py`")

    def detect(self):
        return "PMI_SIZE" in self.environ and "MPI_LOCALNRANKS" in self.environ


class MVAPICH(Launcher):
    name = "mpirun_rsh (MVAPICH)"
    size_var = "MV2_COMM_WORLD_SIZE"
    fix = Hydra.fix

    def detect(self):
        return self.size_var in self.environ


class SlurmStep(Launcher):
    """A task of an ``srun`` step; the PMI plugin is read from what srun exported."""

    size_var = "SLURM_STEP_NUM_TASKS"
    _fix_none = ("srun started independent processes without MPI wire-up: use `srun --mpi=pmi2` "
           "(MPICH, Intel MPI, MVAPICH) or `srun --mpi=pmix` (Open MPI); "
           "`srun --mpi=list` shows what this cluster offers")

    def detect(self):
        return self.size_var in self.environ

    @property
    def fix(self) -> str:
        plugin = self.plugin
        if plugin == "none":
            return SlurmStep._fix_none
        return (f"srun did wire up MPI (--mpi={plugin}), but this MPI library did not use "
                f"it: mpi4py is probably built against another MPI than the one that speaks "
                f"this cluster's {plugin}. Check `python -c 'from mpi4py import MPI; "
                f"print(MPI.Get_library_version())'` against the cluster's MPI module, and "
                f"try the other plugin (`srun --mpi=list` shows them)")

    @property
    def plugin(self) -> str:
        if any(k.startswith("PMIX_") for k in self.environ):
            return "pmix"
        if "PMI_FD" in self.environ or "PMI_SIZE" in self.environ:
            return "pmi2"
        return "none"

    @property
    def name(self):
        return f"srun --mpi={self.plugin}"


class PMIx(Launcher):
    name = "PMIx (prterun or another PMIx launcher)"

    def detect(self):
        return "PMIX_RANK" in self.environ


class PMI(Launcher):
    name = "PMI"
    size_var = "PMI_SIZE"
    fix = Hydra.fix

    def detect(self):
        return self.size_var in self.environ


# Most specific first: Hydra may bootstrap through srun, so it sets both kinds.
LAUNCHERS = (OpenMPI, Hydra, MVAPICH, SlurmStep, PMIx, PMI)


def detect_launcher(environ: Optional[Mapping[str, str]] = None) -> Launcher:
    """Return the launcher that started this process (``Launcher`` itself for none).

    Example::

        >>> detect_launcher({"SLURM_STEP_NUM_TASKS": "4"}).describe()
        'srun --mpi=none (SLURM_STEP_NUM_TASKS=4)'
    """
    for cls in LAUNCHERS:
        launcher = cls(environ)
        if launcher.detect():
            return launcher
    return Launcher(environ)


def check_not_singleton(mpi_size: int, environ: Optional[Mapping[str, str]] = None) -> None:
    """Raise if MPI sees a world of one while the launcher says it started more.

    Raises:
        SingletonLaunchError: naming the launcher variable, its value and the fix.
    """
    launcher = detect_launcher(environ)
    size = launcher.world_size
    if mpi_size == 1 and size is not None and size > 1:
        raise SingletonLaunchError(
            f"MPI world size is 1 but {launcher.size_var}={size}: {launcher.name} started "
            f"{size} processes that each see only themselves, so each would train alone. "
            f"Fix: {launcher.fix}."
        )
