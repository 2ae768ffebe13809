"""The fault soak's short version (``benchmarks/bench_faults.py``, one run per kind at
``MPI_THREAD_SERIALIZED``): on 2 emulated nodes x 2 ranks training with no pause, each
fault lands at a random moment, and each run must end as the soak's target says: no hang,
no crash, a line naming the node or rank where any rank lives to say it, within
HPCDDP_TIMEOUT + 30 s, nothing of MPICH's left in /dev/shm and no rank left running
after the ends hpcddp controls, and a resume that reaches the parameters of an
uninterrupted run, and a log file (the launcher's output, as under sbatch) that kept every
line. Nothing is set but what make demo installs. The soak builds and removes its own
cluster."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from testbed import EmulatedCluster
from testbed.network import check_can_build

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("ranks_killed", "link_down", "frozen", "stuck", "slow")
# The ends hpcddp controls (the watchdog's abort, the ranks cut off ending themselves):
# nothing may be left. A node's killed or frozen processes end, or not, as the fault
# leaves them; the soak's table reports what they left.
HPCDDP_ENDS = ("link_down", "stuck", "slow")


def test_each_fault_kind_once_at_serialized(tmp_path):
    why = check_can_build()
    if why:
        pytest.skip(f"no emulated cluster here: {why}")
    out = tmp_path / "soak.json"
    try:
        done = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks/bench_faults.py"), "--layout", "2x2",
             "--runs", "1", "--kinds", ",".join(KINDS), "--level", "serialized",
             "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True, timeout=900)
    finally:
        EmulatedCluster.down_by_name("hdsoak")  # if the soak was killed before its own
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    for kind in KINDS:
        row = result["table"][kind]
        runs = [r for r in result["runs"] if r["kind"] == kind]
        assert row["runs"] == 1, (kind, runs)
        assert row["hangs"] == 0 and row["crashes"] == 0, (kind, runs)
        assert row["ends_without_naming"] == 0, (kind, runs)
        assert row["identical"] == 1, (kind, runs)
        # The launcher wrote to a regular file, as under sbatch, and it lost no line.
        assert all(r["output"] == "file" and r["log_kept"] for r in runs), (kind, runs)
        if kind != "slow":  # the slow rank's run must go on to its end
            assert row["ended_within_timeout_plus_30"] == 1, (kind, runs)
        if kind in HPCDDP_ENDS:
            assert row["shm_segments_left"] == 0 and row["ranks_left"] == 0, (kind, runs)
