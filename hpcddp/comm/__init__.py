"""The MPI layer: the world communicator, node layout, CUDA-awareness and non-blocking
operations on buffers. Nothing here imports torch; it works on NumPy arrays, CuPy
arrays, or anything else mpi4py accepts as a buffer (buffer protocol, DLPack,
``__cuda_array_interface__``).

Importing this package starts nothing: ``mpi4py.MPI`` (and with it ``MPI_Init``) is
imported when one of the names below is first used.
"""

from hpcddp.lazy import lazy_names

_PUBLIC = {
    "CudaAwareness": ".cuda_aware", "detect_cuda_aware": ".cuda_aware",
    "Handle": ".handle", "HandleTimeout": ".handle", "wait_all": ".handle",
    "NodeLayout": ".topology", "clone_comm": ".topology", "node_layout": ".topology",
    "install_abort_hook": ".abort", "abort_job": ".abort",
    "decide_on_root": ".agree", "share_outcome": ".agree",
    "Closable": ".lifetime", "close_all": ".lifetime", "free_comm": ".lifetime",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
