"""Rank 1 raises before hpcddp.init(); the other ranks call it.

argv[1]: "hpcddp" (hpcddp imported first), "hpcddp+mpi4py" (and mpi4py.MPI, so MPI is
initialized), "bare" (neither imported: the error comes first), "bare+mpi4py".
"""

import os
import sys

mode = sys.argv[1]
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
if mode.endswith("mpi4py"):
    from mpi4py import MPI  # noqa: F401 - initializes MPI
if mode.startswith("hpcddp"):
    import hpcddp  # noqa: F401
if rank == 1:
    raise ImportError("deliberate failure on rank one before hpcddp.init()")
import hpcddp  # noqa: E402

hpcddp.init()
hpcddp.get_world().barrier()
print("a rank passed the barrier, which must not happen", flush=True)
