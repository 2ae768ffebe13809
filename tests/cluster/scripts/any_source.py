"""MPI_ANY_SOURCE with one thread and no hpcddp: every rank but 0 sends rank 0 a message,
rank 0 receives each from any source, then all meet in a barrier; ITERATIONS times.
Prints `lost at iteration I` and aborts with status 3 when a receive has not completed in
5 s."""

import sys
import time

from mpi4py import MPI

LOST = 3  # the exit status of a job that lost a receive
comm = MPI.COMM_WORLD
buf = bytearray(8)
for iteration in range(int(sys.argv[1])):
    if comm.rank == 0:
        for _ in range(comm.size - 1):
            request, since = comm.Irecv(buf, source=MPI.ANY_SOURCE, tag=5), time.monotonic()
            while not request.Test():
                if time.monotonic() - since > 5:
                    print(f"lost at iteration {iteration}", flush=True)
                    time.sleep(1)  # the line travels to the launcher before the abort
                    comm.Abort(LOST)
    else:
        comm.Send(bytes(8), dest=0, tag=5)
    comm.Barrier()
if comm.rank == 0:
    print(f"every receive arrived (thread level {MPI.Query_thread()})", flush=True)
