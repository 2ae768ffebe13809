"""Outside Slurm, the preemption signal checkpoints and exits; running again resumes and
ends where an uninterrupted run ends."""

import os
import re
import signal
import subprocess
import sys
import time

from jobs_util import ROOT, clean_env, mpiexec


def _ranks(marker):
    """PIDs of the Python ranks whose command line holds ``marker`` (not the launcher)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"python") and marker.encode() in b" ".join(argv):
            pids.append(int(pid))
    return pids


def _digest(text):
    return re.search(r"parameters_sha256=(\w+)", text).group(1)


def test_signal_checkpoints_and_exits_then_resume_matches(run_job, tmp_path):
    run_dir = tmp_path / "preempted"
    args = [mpiexec(), "-n", "2", sys.executable, "examples/train_digits.py", "--run-dir",
            str(run_dir), "--epochs", "40"]
    log = tmp_path / "log"
    with open(log, "w") as out:
        job = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                               env=clean_env({}), start_new_session=True)
        deadline = time.monotonic() + 120
        while "epoch 3:" not in log.read_text():
            assert time.monotonic() < deadline and job.poll() is None, log.read_text()[-2000:]
            time.sleep(0.05)
        ranks = _ranks(str(run_dir))
        assert len(ranks) == 2
        for pid in ranks:
            os.kill(pid, signal.SIGUSR1)
        assert job.wait(timeout=120) == 0, log.read_text()[-3000:]
    text = log.read_text().replace("\r", "\n")
    assert "hpcddp: preempted; not under Slurm, exiting" in text
    assert "world_size=2 test_accuracy" not in text
    resumed = run_job(["examples/train_digits.py", "--run-dir", run_dir, "--epochs", "40"],
                      n=2, timeout=300)
    assert resumed.returncode == 0 and "resumed from" in resumed.stdout, resumed.stderr
    reference = run_job(["examples/train_digits.py", "--run-dir", tmp_path / "straight",
                         "--epochs", "40"], n=2, timeout=300)
    assert reference.returncode == 0, reference.stderr
    assert _digest(resumed.stdout) == _digest(reference.stdout)
