"""Rank 0 revokes every communicator hpcddp holds, as a recovery does when a rank dies,
while a communicator it asked MPI to make (``Idup``) is still being made: rank 1 has
not asked yet. The one being made is not revoked (Open MPI 5.0 dereferences its unset
state there); its making fails, the parent being revoked, and the revoke reaches rank 1.

Run under ``mpirun --with-ft ulfm`` by tests/jobs/test_elastic_ulfm.py.
"""

import os
import sys

from mpi4py import MPI

import hpcddp
from hpcddp.comm.topology import clone_comm
from hpcddp.faults.failed import is_process_failure, revoke_all

world = hpcddp.init()
side = clone_comm(world.comm, name="side")      # tells rank 1 that the revoke was made
parent = clone_comm(world.comm, name="parent")  # the one rank 0's dup is made from
try:
    if world.rank == 0:
        being_made, request = parent.Idup()
        revoke_all()
        print("rank 0 revoked every communicator", flush=True)
        request.Wait()
    else:
        side.Barrier()  # ends when rank 0's revoke reaches it
    print(f"rank {world.rank}: no error after the revoke", flush=True)
    code = 1
except MPI.Exception as error:
    # rank 0: the dup fails (Open MPI 5.0: MPI_ERR_INTERN); rank 1: MPI_ERR_REVOKED
    print(f"rank {world.rank}: {error.Get_error_string()} after the revoke", flush=True)
    code = 0 if world.rank == 0 or is_process_failure(error) else 1
sys.stdout.flush()
os._exit(code)  # every communicator is revoked: nothing to finalize on
