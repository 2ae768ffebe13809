"""After hpcddp.shutdown() and init() again, a test that fails on rank 1 only.

The plugin must abort through the world of now, not the one it was started with, whose
communicator the shutdown freed. Run by tests/jobs/test_jobs.py.
"""

import hpcddp


def test_reinit_then_fail_on_rank_one():
    hpcddp.shutdown()
    world = hpcddp.init()
    assert world.rank != 1, "deliberate assertion failure on rank one after a re-init"
    world.comm.Barrier()
