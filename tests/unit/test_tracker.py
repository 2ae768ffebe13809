"""multiprocessing's resource tracker outside the process group a launcher kills
(``hpcddp.startup.tracker``), on real processes: a stand-in rank leads its own session,
as under Hydra, makes a queue for spawn workers, and its whole group is killed."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

RANK = r"""
import multiprocessing, sys, time
from hpcddp.startup.tracker import keep_tracker_apart

def work(queue):
    queue.get()

if __name__ == "__main__":
    if sys.argv[2] == "apart":
        assert keep_tracker_apart() and keep_tracker_apart()
    context = multiprocessing.get_context(sys.argv[1])
    queue = context.Queue()
    worker = context.Process(target=work, args=(queue,), daemon=True)
    worker.start()
    names = [lock._semlock.name for lock in (queue._rlock, queue._wlock, queue._sem)]
    print(" ".join(names), flush=True)
    time.sleep(120)
"""


def _files(names):
    return [Path("/dev/shm", "sem." + name.lstrip("/")) for name in names]


def _kill_group_of_rank(tmp_path, method, how):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # this checkout's hpcddp
    proc = subprocess.Popen([sys.executable, str(script), method, how], stdout=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    try:
        names = proc.stdout.readline().split()
        assert len(names) == 3 and all(path.exists() for path in _files(names)), names
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # what Hydra does to end a rank
        proc.wait()
    deadline = time.monotonic() + 10  # the tracker removes them once the group is gone
    while any(path.exists() for path in _files(names)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [path for path in _files(names) if path.exists()]


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_names_are_removed_when_the_rank_and_its_workers_are_killed(tmp_path, method):
    assert _kill_group_of_rank(tmp_path, method, "apart") == []


def test_without_it_the_kill_leaves_the_names(tmp_path):
    """The reference: multiprocessing's own tracker dies with the group."""
    left = _kill_group_of_rank(tmp_path, "spawn", "default")
    for path in left:
        path.unlink()
    assert len(left) == 3
