"""Which network module the ``mpich`` wheel's ch4 device starts with, where nobody chose.

The ``mpich`` wheel from PyPI, which ``pip install '.[mpich]'`` and ``make demo``
install, carries two network modules: UCX, its default, and libfabric's ``ofi``. Over
TCP, UCX's module dies of SIGSEGV in ``MPI_Isend`` once a connection between nodes fails
(a link down, a node frozen): a rank on the healthy node crashes about 40 s after the
fault, before hpcddp's watchdog can name the node (docs/which-mpi.md). With
``ofi`` every fault of hpcddp's soak ended named, with no crash. Shared memory within a
node is MPICH's own in both, and between nodes ``ofi`` moves as much (``bench_network``).
So for that wheel hpcddp sets ``MPIR_CVAR_CH4_NETMOD=ofi`` before ``MPI_Init``.

Every rank must choose the same module, or no two could talk: the choice comes from the
installation (one environment on every node) and from the variables the launcher hands
every rank, never from a node's devices. A choice the user made wins (the variable under
any of MPICH's three prefixes), and so does another MPI: a site's MPICH, an ``mpi4py``
built against a site library, ``MPI4PY_LIBMPI``. For those ``hpcddp doctor`` says what to
set. Standard library only: it runs before ``MPI_Init``.
"""

import ctypes
import os
import sys
from typing import Mapping, NamedTuple, Optional

__all__ = ["NETMOD_VARIABLES", "NetmodChoice", "applied", "apply_netmod", "choose_netmod",
           "device_line", "wheel_libmpi"]

# MPICH reads a control variable under any of these names (MPIR_CVAR_ is documented).
NETMOD_VARIABLES = ("MPIR_CVAR_CH4_NETMOD", "MPICH_CH4_NETMOD", "MPIR_PARAM_CH4_NETMOD")
_CHOSEN = "ofi"
# Variables that make mpi4py load another library than the environment's own.
_OTHER_LIBRARY = ("MPI4PY_LIBMPI", "MPI4PY_MPIABI")


class NetmodChoice(NamedTuple):
    value: Optional[str]  # what hpcddp sets MPIR_CVAR_CH4_NETMOD to; None: nothing
    reason: str


def wheel_libmpi(prefix: str = sys.exec_prefix) -> Optional[str]:
    """The ``mpich`` wheel's ``libmpi`` in this environment, where mpi4py's loader looks
    first (``<prefix>/lib``), or None where the wheel is not installed here."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
        wheel = distribution("mpich")
    except (ImportError, PackageNotFoundError):
        return None
    for entry in wheel.files or []:
        if os.path.basename(str(entry)) == "libmpi.so.12":
            path = os.path.realpath(str(wheel.locate_file(entry)))
            here = os.path.realpath(os.path.join(prefix, "lib", "libmpi.so.12"))
            if path == here and os.path.exists(path):
                return path
    return None


def device_line(libmpi: str) -> str:
    """``MPICH Device: ...`` of the library at ``libmpi`` (``ch4:ucx ofi``), read before
    ``MPI_Init`` (``MPI_Get_library_version`` may be called at any time); "" if none."""
    try:
        library = ctypes.CDLL(libmpi, os.RTLD_LAZY | os.RTLD_LOCAL)
        text = ctypes.create_string_buffer(8192)
        length = ctypes.c_int(0)
        if library.MPI_Get_library_version(text, ctypes.byref(length)) != 0:
            return ""
    except (OSError, AttributeError):
        return ""
    for line in text.value.decode(errors="replace").splitlines():
        if line.startswith("MPICH Device:"):
            return line.split(":", 1)[1].strip()
    return ""


def choose_netmod(environ: Mapping[str, str], libmpi: Optional[str],
                  device: str) -> NetmodChoice:
    """Decide what to set before ``MPI_Init``: ``ofi`` for the ``mpich`` wheel whose
    default is UCX, where neither the user nor another library rules.

    Args:
        environ: the environment the launcher handed this rank.
        libmpi: the wheel's library in this environment (``wheel_libmpi()``), or None.
        device: that library's device line (``device_line()``), e.g. ``ch4:ucx ofi``.

    Example::

        >>> choose_netmod({}, "/venv/lib/libmpi.so.12", "ch4:ucx ofi").value
        'ofi'
        >>> choose_netmod({"MPIR_CVAR_CH4_NETMOD": "ucx"}, "/venv/lib/libmpi.so.12",
        ...               "ch4:ucx ofi").value is None
        True
    """
    for name in NETMOD_VARIABLES:
        if environ.get(name, "").strip():
            return NetmodChoice(None, f"{name}={environ[name].strip()} set by the user")
    if libmpi is None:
        return NetmodChoice(None, "not the mpich wheel: the MPI's own default")
    for name in _OTHER_LIBRARY:
        if environ.get(name, "").strip():
            return NetmodChoice(None, f"{name} set: mpi4py may load another MPI")
    if "libmpi" in environ.get("LD_PRELOAD", ""):
        return NetmodChoice(None, "an MPI library in LD_PRELOAD")
    modules = device[4:].replace(",", " ").split() if device.startswith("ch4:") else []
    if not modules or modules[0] != "ucx" or _CHOSEN not in modules:
        return NetmodChoice(None, f"the mpich wheel's device is {device or 'unknown'}: "
                                  f"its own default")
    return NetmodChoice(_CHOSEN, "the mpich wheel: UCX over TCP crashes when a connection "
                                 "between nodes fails; ofi does not")


def apply_netmod(environ=os.environ) -> NetmodChoice:
    """Set ``MPIR_CVAR_CH4_NETMOD`` in ``environ`` as ``choose_netmod`` decides; before
    ``MPI_Init``, once a process (later calls return the first choice). Returns the
    choice and its reason."""
    if _applied:
        return _applied[0]
    libmpi = wheel_libmpi()
    choice = choose_netmod(environ, libmpi, device_line(libmpi) if libmpi else "")
    if choice.value is not None:
        environ[NETMOD_VARIABLES[0]] = choice.value
    _applied[:] = [choice]
    return choice


_applied = []


def applied() -> Optional[NetmodChoice]:
    """What ``apply_netmod`` decided in this process, or None where it did not run."""
    return _applied[0] if _applied else None
