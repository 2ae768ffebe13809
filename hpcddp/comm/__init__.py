"""The MPI layer: the world communicator, node layout, CUDA-awareness and non-blocking
collectives on buffers. Nothing here imports torch; it works on NumPy arrays, CuPy
arrays, or anything else mpi4py accepts as a buffer (buffer protocol, DLPack,
``__cuda_array_interface__``).
"""

from hpcddp.comm.abort import install_abort_hook
from hpcddp.comm.collectives import Handle, wait_all
from hpcddp.comm.cuda_aware import CudaAwareness, detect_cuda_aware
from hpcddp.comm.topology import NodeLayout, clone_comm, node_layout

__all__ = [
    "CudaAwareness",
    "Handle",
    "NodeLayout",
    "clone_comm",
    "detect_cuda_aware",
    "install_abort_hook",
    "node_layout",
    "wait_all",
]
