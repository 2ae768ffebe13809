"""An aborted job leaves nothing of its ranks' multiprocessing queues in /dev/shm.

The launcher ends each rank with its whole process group. multiprocessing's resource
tracker, which removes the semaphore names a killed process leaves, is started outside
that group (``hpcddp.startup.tracker``), so it outlives the rank and removes them."""

import time
from pathlib import Path

import pytest


def _left(names):
    return [name for name in names if Path("/dev/shm", "sem." + name.lstrip("/")).exists()]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_an_aborted_rank_leaves_no_semaphore_names(run_job, method):
    job = run_job(["tests/jobs/scripts/workers_then_abort.py", method], n=2, timeout=120)
    assert not job.timed_out and job.returncode != 0, job.output[-3000:]
    assert "rank 1 fails while its DataLoader's workers run" in job.stderr, job.output[-3000:]
    lines = [line for line in job.stdout.splitlines() if " semaphores: " in line]
    assert len(lines) == 2, job.output[-3000:]
    names = [name for line in lines for name in line.split(": ", 1)[1].split()]
    assert len(names) >= 6, lines  # three per worker queue, at least one queue a rank
    deadline = time.monotonic() + 10  # the tracker removes them once the ranks are gone
    while _left(names) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _left(names), f"left in /dev/shm after the job ended: {_left(names)}"
