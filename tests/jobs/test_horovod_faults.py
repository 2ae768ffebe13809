"""A Horovod program that stops meeting itself ends, as Horovod's stall check promises:
a warning naming the ranks on each side after ``HOROVOD_STALL_CHECK_TIME_SECONDS``,
then, past ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS``, the whole job, non-zero, with the
operation and the ranks named, in the job's output file (as ``sbatch --output`` writes
it)."""

import os
import signal
import subprocess
import sys
import time

from jobs_util import ROOT, clean_env, mpiexec

SCRIPT = ROOT / "tests/jobs/scripts/horovod_stall.py"
CHECK_S, SHUTDOWN_S = 2, 6


def _run_to_file(log, env, timeout):
    with open(log, "w") as out:
        proc = subprocess.Popen([*mpiexec(), "-n", "2", sys.executable, str(SCRIPT)],
                                stdout=out, stderr=subprocess.STDOUT, env=clean_env(env),
                                cwd=ROOT, start_new_session=True)
        start = time.monotonic()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, time.monotonic() - start, log.read_text()


def test_a_stalled_operation_is_warned_of_then_ends_the_job(tmp_path):
    code, seconds, text = _run_to_file(tmp_path / "job.out", {
        "HOROVOD_STALL_CHECK_TIME_SECONDS": str(CHECK_S),
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(SHUTDOWN_S),
        "HPCDDP_TIMEOUT": "300"}, timeout=120)
    assert code not in (0, None, -signal.SIGKILL), text
    assert text.count("warmed up") == 2, text
    # The warning, once, then the end: the coordinator (rank 0) names both sides.
    assert text.count("'only-on-rank-1' started") >= 1, text
    warning = next(line for line in text.splitlines() if "not yet on rank 0" in line)
    assert "allreduce 'only-on-rank-1'" in warning and "on rank 1" in warning, warning
    assert "hpcddp: rank 0 of 2" in text, text
    assert "never on rank 0 (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS)" in text, text
    # Well before hpcddp's own HPCDDP_TIMEOUT would have ended it.
    assert seconds < 120, f"took {seconds:.0f} s"
