"""Start MPI as a training script does (importing hpcddp.checkpoint starts it), then
hpcddp, and say which network module MPICH reads and what hpcddp decided."""
import os
import sys

import hpcddp
import hpcddp.checkpoint  # noqa: F401 - starts MPI at import, before init()
from hpcddp.env.netmod import applied

world = hpcddp.init()
# One write for the line (print() under PYTHONUNBUFFERED writes the newline apart).
sys.stdout.write(f"rank {world.rank}: MPIR_CVAR_CH4_NETMOD={os.environ.get('MPIR_CVAR_CH4_NETMOD')} "
                 f"reason={applied().reason}\n")
sys.stdout.flush()
hpcddp.shutdown()
