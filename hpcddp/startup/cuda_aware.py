"""Does the MPI library accept CUDA device buffers?

Handing a device pointer to an MPI that is not CUDA-aware segfaults or silently reads
garbage (mpi4py/mpi4py#115), so the answer is decided carefully and its reason kept.
"""

import ctypes
import os
from typing import NamedTuple, Optional

from mpi4py import MPI

from hpcddp.startup.mpi_library import mapped_mpi_libraries

__all__ = ["CudaAwareness", "detect_cuda_aware", "info_value", "query_mpix_cuda_support"]


class CudaAwareness(NamedTuple):
    aware: bool
    reason: str

    def __bool__(self):
        return self.aware


def _loaded_mpi_library():
    """A ctypes handle on the MPI library mpi4py is using, or None.

    ``CDLL(None)`` only sees the global namespace, where a library loaded by a Python
    extension module (RTLD_LOCAL) does not appear. ``dlsym`` on the handle of mpi4py's
    own extension searches its dependency tree, which holds libmpi; where mpi4py opened
    libmpi itself at run time, the mapped files name it.
    """
    mode = getattr(os, "RTLD_NOLOAD", 0) | ctypes.RTLD_LOCAL
    for path in [MPI.__file__, *mapped_mpi_libraries()]:
        try:
            lib = ctypes.CDLL(path, mode=mode)
        except OSError:
            continue
        if hasattr(lib, "MPIX_Query_cuda_support"):
            return lib
    return None


def query_mpix_cuda_support() -> Optional[bool]:
    """Return ``MPIX_Query_cuda_support()`` as a bool, or None if the library lacks it."""
    lib = _loaded_mpi_library()
    if lib is None:
        return None
    fn = lib.MPIX_Query_cuda_support
    fn.restype, fn.argtypes = ctypes.c_int, []
    return bool(fn())


def info_value(comm, key: str) -> Optional[str]:
    """The value of ``key`` in ``comm``'s info, or None (an MPI call: make it on hpcddp's
    MPI thread, ``hpcddp.comm.serial.call(info_value, comm, key)``)."""
    try:
        info = MPI.Intracomm.Get_info(comm)
    except MPI.Exception:
        return None
    try:
        return info.Get(key)
    finally:
        info.Free()


def detect_cuda_aware(alloc_kinds: Optional[str],
                      override: Optional[bool] = None) -> CudaAwareness:
    """Decide whether MPI may be given CUDA device buffers, and say why.

    Order: the ``HPCDDP_CUDA_AWARE`` override (passed in as ``override``), then
    ``MPIX_Query_cuda_support`` from the loaded MPI library, then the MPI-4.1 info key
    ``mpi_memory_alloc_kinds`` (``alloc_kinds``: its value in the world communicator's
    info, None where it has none) listing ``cuda:device`` (``cuda:host`` says nothing
    about device buffers).
    """
    if override is not None:
        return CudaAwareness(bool(override), f"HPCDDP_CUDA_AWARE={int(override)} (override)")
    mpix = query_mpix_cuda_support()
    if mpix:
        return CudaAwareness(True, "MPIX_Query_cuda_support() = 1")
    kinds = alloc_kinds
    if kinds is not None and "cuda:device" in kinds.split(","):
        return CudaAwareness(True, f"mpi_memory_alloc_kinds = {kinds}")
    said = []
    if mpix is not None:
        said.append("MPIX_Query_cuda_support() = 0")
    said.append(f"mpi_memory_alloc_kinds = {kinds}" if kinds is not None
                else "no mpi_memory_alloc_kinds info key")
    return CudaAwareness(False, "; ".join(said))
