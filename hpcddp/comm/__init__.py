"""The MPI layer: the world communicator, node layout and non-blocking
operations on buffers. Nothing here imports torch; it works on NumPy arrays, CuPy
arrays, or anything else mpi4py accepts as a buffer (buffer protocol, DLPack,
``__cuda_array_interface__``).

Importing this package starts nothing: ``mpi4py.MPI`` (and with it ``MPI_Init``) is
imported when one of the names below is first used.
"""

from hpcddp.lazy import lazy_names

_PUBLIC = {
    "Handle": ".handle", "HandleTimeout": ".handle", "wait_all": ".handle",
    "NodeLayout": ".topology", "clone_comm": ".topology", "node_layout": ".topology",
    "decide_on_root": ".outcome", "share_outcome": ".outcome",
    "Closable": ".lifetime", "close_all": ".lifetime", "free_comm": ".lifetime",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
