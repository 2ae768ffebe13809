"""A helper thread on rank 1 dies of an uncaught exception inside a test, while both
ranks wait in a collective and the test has printed to its captured output.

Run by tests/jobs/test_jobs.py under ``pytest -p hpcddp.testing``; not collected by
``make test`` directly (the name does not start with ``test_``).
"""

import threading

import hpcddp


def _die():
    raise LookupError("deliberate failure in a helper thread on rank one")


def test_a_helper_thread_dies_on_rank_one():
    world = hpcddp.get_world()
    print(f"captured line of rank {world.rank}")
    if world.rank == 1:
        threading.Thread(target=_die, name="helper").start()
    world.comm.Barrier()  # rank 0 never leaves it: rank 1's abort must end the job
    if world.rank == 1:
        world.comm.Barrier()
