"""The one road from a torch tensor to MPI.

A ``Transport`` on a communicator turns tensor operations (allreduce, broadcast, any
collective or point-to-point call) into MPI requests, issued strictly in the order they
were started, and returns a ``Transfer``: a ``hpcddp.comm.Handle`` that owns its buffers
until it completes. How a tensor's memory reaches MPI is a ``Route``, chosen once per
buffer: ``HostRoute`` (CPU memory, in place), ``DeviceRoute`` (CUDA memory, for a
CUDA-aware MPI) or ``StagedRoute`` (CUDA memory through pinned host buffers). The DDP
reducer, the torch.distributed backend and DDP's construction-time broadcasts all go
this way.
"""

from hpcddp.transport.routes import Binding, DeviceRoute, HostRoute, Route
from hpcddp.transport.staging import StagedRoute
from hpcddp.transport.transfer import Use, reads, updates, writes
from hpcddp.transport.transport import Transfer, Transport

__all__ = ["Binding", "DeviceRoute", "HostRoute", "Route", "StagedRoute", "Transfer",
           "Transport", "Use", "reads", "updates", "writes"]
