"""One thread of a rank, hpcddp's MPI thread, makes its MPI calls, so no two threads are
ever inside MPI at once (``hpcddp.comm.serial``), checked below mpi4py and hpcddp: a
library preloaded into each rank wraps every MPI function of the MPI library and counts
each thread's calls and the calls that find another thread inside
(``tests/support/mpi_entry_check.py``)."""

import json
from pathlib import Path

import pytest

import mpi_entry_check


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    try:
        return mpi_entry_check.build(tmp_path_factory.mktemp("entry"))
    except (OSError, FileNotFoundError) as why:
        pytest.skip(f"cannot build the MPI entry checker here: {why}")


# What mpi4py calls on the main thread itself: MPI_Init_thread and its checks at import,
# MPI_Finalize at exit.
_MPI4PY_OWN = {"MPI_Init_thread", "MPI_Init", "MPI_Comm_size", "MPI_Comm_rank",
               "MPI_Comm_set_errhandler", "MPI_Finalize"}


def _counts(log: Path):
    """Each rank's counts (files of processes that made no MPI call are the launcher's)."""
    found = [json.loads(p.read_text()) for p in log.parent.glob(log.name + ".*")]
    return [c for c in found if c["calls"]]


def test_the_checker_sees_two_threads_in_mpi(run_job, checker, tmp_path):
    """Its control: a thread that probes while the main thread reduces is counted (at
    MULTIPLE, the level that allows it; the serialized suite sets another for the rest)."""
    script = tmp_path / "two_threads.py"
    # Each rank in turn sleeps while the others wait in a barrier for 0.3 s: a short
    # collective (Open MPI's take microseconds on shared memory) can end before the
    # probing thread gets Python's GIL back, and no call would overlap.
    script.write_text(
        "import threading, time\nfrom mpi4py import MPI\ncomm = MPI.COMM_WORLD\nstop = []\n"
        "def probe():\n    while not stop:\n        comm.Iprobe()\n"
        "thread = threading.Thread(target=probe)\nthread.start()\n"
        "for turn in range(comm.size):\n    if turn == comm.rank:\n        time.sleep(0.3)\n"
        "    comm.Barrier()\n"
        "stop.append(1)\nthread.join()\n")
    log = tmp_path / "entry"
    job = run_job([script], n=2, timeout=60,
                  env={"LD_PRELOAD": str(checker), "MPI_ENTRY_CHECK_LOG": str(log),
                       "MPI4PY_RC_THREAD_LEVEL": "multiple"})
    assert job.returncode == 0, job.output
    counts = _counts(log)
    assert len(counts) == 2 and all(c["overlaps"] > 0 for c in counts), counts


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_helper_threads_never_enter_mpi_beside_the_main_thread(run_job, checker, tmp_path,
                                                               level):
    log = tmp_path / "entry"
    job = run_job(["tests/jobs/scripts/helpers_in_mpi.py"], n=3, timeout=120,
                  env={"LD_PRELOAD": str(checker), "MPI_ENTRY_CHECK_LOG": str(log),
                       "MPI4PY_RC_THREAD_LEVEL": level, "HPCDDP_STALL_WARN": "0.5"})
    assert job.returncode == 0, job.output
    for rank in range(3):
        assert f"rank {rank}: level={level} steps=30" in job.stdout, job.output
    # The watchdog asked about the stall, so its thread called MPI while the main
    # thread waited in one: rank 1 answered from user code.
    assert "stalled for 0.5 s" in job.stderr and "rank 1 is in user code" in job.stderr, \
        job.stderr
    counts = _counts(log)
    assert len(counts) == 3, counts
    for count in counts:
        assert count["calls"] > 1000 and count["overlaps"] == 0, count
        # The main thread initializes and finalizes MPI and makes nothing else but mpi4py's
        # own calls at import; one other thread, hpcddp's MPI thread, makes the rest.
        assert count["threads"] == 2, count
        assert set(count["init_thread_names"]) <= _MPI4PY_OWN and count["init_thread"] < 10, \
            count
