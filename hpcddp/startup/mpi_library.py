"""The MPI library this process has loaded, and the launcher installed with it.

mpi4py may load one of several MPIs (``MPI4PY_MPIABI``, ``LD_LIBRARY_PATH``), and a
virtual environment may hold the ``mpich`` wheel's ``mpiexec`` beside a site's CUDA-aware
Open MPI: what is on PATH, or beside Python, need not be the loaded library's. The
library's own files tell: the mapped ``libmpi`` and the ``bin`` of its installation.
"""

import os
from typing import List, Optional

__all__ = ["launcher_of_loaded_mpi", "library_version_line", "mapped_mpi_libraries",
           "mpich_network_module", "rdma_devices", "ucx_on_tcp_advice"]


def library_version_line() -> str:
    """The first line of ``MPI_Get_library_version``, without the NUL that Open MPI's
    string ends with (``str.strip`` keeps it)."""
    from mpi4py import MPI
    return MPI.Get_library_version().strip(" \t\r\n\x00").splitlines()[0].strip()


def mpich_network_module(environ=os.environ) -> Optional[str]:
    """The network module MPICH's ch4 device uses in this process (``ucx``, ``ofi``):
    ``MPIR_CVAR_CH4_NETMOD`` where set, else the first of those it was built with
    (``MPICH Device: ch4:ucx ofi``); None for another MPI."""
    from mpi4py import MPI
    for line in MPI.Get_library_version().splitlines():
        if line.startswith("MPICH Device:"):
            device = line.split(":", 1)[1].strip()
            if not device.startswith("ch4:"):
                return None
            chosen = environ.get("MPIR_CVAR_CH4_NETMOD", "").strip()
            return chosen or device[4:].replace(",", " ").split()[0]
    return None


def rdma_devices() -> int:
    """RDMA devices on this node (InfiniBand, RoCE, Omni-Path): without one, UCX runs on
    TCP."""
    try:
        return len(os.listdir("/sys/class/infiniband"))
    except OSError:
        return 0


def ucx_on_tcp_advice(hosts: List[str]) -> str:
    """What to tell a job whose MPICH runs its UCX module over TCP on ``hosts`` (a site's
    MPICH, or the wheel where the user chose UCX: hpcddp chooses ofi for the wheel)."""
    return (f"MPICH's UCX network module runs on TCP here (no RDMA device on "
            f"{', '.join(hosts)}). When a connection between nodes fails (a link down or "
            f"crawling, a node frozen), MPICH 5 dies of SIGSEGV in MPI_Isend, often before "
            f"hpcddp's watchdog can name the node. export MPIR_CVAR_CH4_NETMOD=ofi "
            f"FI_PROVIDER=tcp before launching: with its ofi module no rank crashed in "
            f"hpcddp's fault soak (docs/which-mpi.md).")


def mapped_mpi_libraries() -> List[str]:
    """Paths of the MPI libraries mapped into this process: ``libmpi*`` (MPICH's, Open
    MPI's, Cray's ``libmpi_cray``, the MPI ABI's ``libmpi_abi``) and ``libmpich*``."""
    try:
        with open("/proc/self/maps") as maps:
            files = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted(f for f in files if os.path.basename(f).startswith("libmpi"))


def launcher_of_loaded_mpi() -> Optional[str]:
    """The ``mpiexec`` (else ``mpirun``) of the installation whose MPI library this process
    loaded (``<prefix>/bin`` beside ``<prefix>/lib``), or None where there is none."""
    for library in mapped_mpi_libraries():
        prefix = os.path.dirname(os.path.dirname(os.path.realpath(library)))
        for name in ("mpiexec", "mpirun"):
            path = os.path.join(prefix, "bin", name)
            if os.access(path, os.X_OK):
                return path
    return None
