"""Save one checkpoint of a model whose weights all equal STEP, as an MPI singleton.

    python save_once.py DIR STEP [pause|ready]

Used under strace to kill the writer at chosen system calls. With ``pause``, the save
stops in the middle of writing its state, says "paused", and goes on when a line
arrives on stdin: a save in progress, for a reader beside it. With ``ready``, the writer
says "ready" once MPI is up and saves when a line arrives: strace attaches meanwhile, so
that its count of system calls starts at the save, not in MPI's start-up.
"""

import collections
import sys

import torch
from mpi4py import MPI

import hpcddp.checkpoint as checkpoint
from hpcddp.startup.mpi_init import unlink_mapped_segments

# This writer is killed on purpose, before MPI_Finalize would remove the name of MPICH's
# segment: a singleton has no other rank to attach it, so the name goes now.
unlink_mapped_segments()


class _Pause:
    """Loads as an empty OrderedDict. save pickles ``extra`` twice: first to check that it
    loads back, then inside the state, after the temporary directory is made. The second
    time it says "paused" and waits for a line on stdin."""

    pickled = 0

    def __reduce__(self):
        _Pause.pickled += 1
        if _Pause.pickled == 2:
            print("paused", flush=True)
            sys.stdin.readline()
        return collections.OrderedDict, ()


directory, step = sys.argv[1], int(sys.argv[2])
model = torch.nn.Linear(256, 256)
with torch.no_grad():
    for p in model.parameters():
        p.fill_(step)
extra = {"pause": _Pause()} if sys.argv[3:] == ["pause"] else None
if sys.argv[3:] == ["ready"]:
    print("ready", flush=True)
    sys.stdin.readline()
checkpoint.save(directory, model, step=step, extra=extra, comm=MPI.COMM_SELF)
