"""A test that fails on rank 1 only, while rank 0 waits in a collective.

Run by tests/jobs/test_jobs.py under ``pytest -p hpcddp.testing``; not collected by
``make test`` directly (the name does not start with ``test_``).
"""

import hpcddp


def test_fails_on_rank_one():
    world = hpcddp.get_world()
    assert world.rank != 1, "deliberate assertion failure on rank one"
    world.comm.Barrier()
