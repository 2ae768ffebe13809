"""The MPI layer: the world communicator, node layout, CUDA-awareness and non-blocking
operations on buffers. Nothing here imports torch; it works on NumPy arrays, CuPy
arrays, or anything else mpi4py accepts as a buffer (buffer protocol, DLPack,
``__cuda_array_interface__``).

Importing this package starts nothing: ``mpi4py.MPI`` (and with it ``MPI_Init``) is
imported when one of the names below is first used.
"""

import importlib

_PUBLIC = {
    "CudaAwareness": "cuda_aware", "detect_cuda_aware": "cuda_aware",
    "Handle": "handle", "HandleTimeout": "handle", "wait_all": "handle",
    "NodeLayout": "topology", "clone_comm": "topology", "node_layout": "topology",
    "install_abort_hook": "abort", "abort_job": "abort",
    "decide_on_root": "agree", "share_outcome": "agree",
    "Closable": "lifetime", "close_all": "lifetime", "free_comm": "lifetime",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hpcddp.comm' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hpcddp.comm.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
