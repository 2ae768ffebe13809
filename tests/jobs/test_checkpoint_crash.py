"""Crash safety: the writer killed with SIGKILL at fixed system calls of every phase of a
save (strace's fault injection); a load must find the previous or the new checkpoint,
whole, and both must be seen across the cases."""

import os
import shutil
import subprocess
import sys
import time
import warnings

import pytest
import torch
from jobs_util import job_segments, segments_left_since
from mpi4py import MPI

import hpcddp.checkpoint as checkpoint

STRACE = shutil.which("strace")
pytestmark = pytest.mark.skipif(STRACE is None, reason="needs strace (apt-get install strace)")
SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "save_once.py")
RENAMES = "rename,renameat,renameat2"

# (system call set, which call, counted from the save): each kills the writer on entering
# that call, so the call itself never happens. write 1-9: state.pt (torch writes it in 9
# here), 10: the manifest, 11: `latest`'s temporary; fsync 1: state.pt, 2: manifest, 3:
# the temporary directory, rename 1: into place, fsync 4: the parent, fsync 5: `latest`'s
# temporary, rename 2: `latest`, fsync 6: the parent again.
CASES = [("write", 1), ("write", 5), ("write", 10), ("write", 11), ("fsync", 1),
         ("fsync", 2), ("fsync", 3), (RENAMES, 1), ("fsync", 4), ("fsync", 5), (RENAMES, 2),
         ("fsync", 6)]


def _save(directory, step, strace=()):
    return subprocess.run([*strace, sys.executable, SCRIPT, str(directory), str(step)],
                          capture_output=True, text=True, timeout=120)


def _traced(pid):
    with open(f"/proc/{pid}/status") as status:
        return any(line.startswith("TracerPid:") and line.split()[1] != "0" for line in status)


def _save_killed(directory, step, syscalls, when):
    """Save with strace attached once MPI is up, to kill the writer on entering the
    ``when``-th of ``syscalls`` counted from the save; the writer's exit status."""
    writer = subprocess.Popen([sys.executable, SCRIPT, str(directory), str(step), "ready"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    tracer = None
    try:
        assert writer.stdout.readline().strip() == "ready"
        tracer = subprocess.Popen([STRACE, "-f", "-qq", "-o", os.devnull, "-e",
                                   f"trace={syscalls}", "-e",
                                   f"inject={syscalls}:signal=KILL:when={when}",
                                   "-p", str(writer.pid)])
        deadline = time.monotonic() + 30
        while not _traced(writer.pid):
            assert tracer.poll() is None and time.monotonic() < deadline, "strace did not attach"
            time.sleep(0.01)
        writer.stdin.write("go\n")
        writer.stdin.flush()
        return writer.wait(timeout=120)
    finally:
        writer.kill()
        writer.wait()
        if tracer is not None:
            tracer.wait(timeout=30)


def _load(directory):
    model = torch.nn.Linear(256, 256)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        resumed = checkpoint.load(directory, model, comm=MPI.COMM_SELF, device="cpu")
    if resumed is None:
        return None
    assert all(torch.all(p == resumed.step) for p in model.parameters()), "a mixed checkpoint"
    return resumed.step


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    results = {}
    before = job_segments()
    first = tmp_path_factory.mktemp("ckpt") / "first"
    assert _save(first, 1).returncode == 0
    for syscalls, when in CASES:
        directory = tmp_path_factory.mktemp("ckpt") / "run"
        shutil.copytree(first, directory)
        returncode = _save_killed(directory, 2, syscalls, when)
        left = _temporaries(directory)
        results[(syscalls, when)] = (returncode, _load(directory), left,
                                     _temporaries(directory))
    for name in segments_left_since(before, job_segments):  # what a killed writer's MPI left
        os.unlink(os.path.join("/dev/shm", name))
    return results


def _temporaries(directory):
    return [n for n in os.listdir(directory) if n.startswith(".tmp-step-")]


@pytest.mark.parametrize("case", CASES, ids=[f"{s.split(',')[0]}{w}" for s, w in CASES])
def test_load_finds_a_whole_checkpoint_after_a_kill(outcomes, case):
    returncode, step, _, _ = outcomes[case]
    assert returncode != 0, "the writer was not killed: the case tests nothing"
    assert step in (1, 2)


def test_both_outcomes_are_seen(outcomes):
    steps = [step for _, step, _, _ in outcomes.values()]
    assert 1 in steps and 2 in steps


def test_load_removes_what_a_killed_save_left(outcomes):
    # Every kill before the new step's directory is renamed into place leaves it: the
    # writes of state.pt and the manifest, fsync 1-3 and rename 1 itself.
    before_rename = [("write", 1), ("write", 5), ("write", 10), ("fsync", 1), ("fsync", 2),
                     ("fsync", 3), (RENAMES, 1)]
    assert [case for case in before_rename if not outcomes[case][2]] == []
    assert all(not after for _, _, _, after in outcomes.values())


def test_load_beside_a_save_in_progress_leaves_it_alone(tmp_path):
    # An evaluation job loading from the directory a training job is saving into.
    directory = tmp_path / "run"
    assert _save(directory, 1).returncode == 0
    writer = subprocess.Popen([sys.executable, SCRIPT, str(directory), "2", "pause"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "paused"
        assert len(_temporaries(directory)) == 1
        assert _load(directory) == 1
        assert len(_temporaries(directory)) == 1, "a live save's directory was removed"
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.wait(timeout=120) == 0
    finally:
        writer.kill()
    assert _load(directory) == 2 and not _temporaries(directory)


def test_fsync_comes_before_rename(tmp_path):
    log = tmp_path / "trace"
    job = _save(tmp_path / "run", 3, [STRACE, "-f", "-qq", "-o", str(log), "-e",
                                      f"trace=fsync,{RENAMES}"])
    assert job.returncode == 0, job.stderr
    calls = [line.split("(")[0].split()[-1] for line in log.read_text().splitlines()
             if "(" in line]
    first_rename = next(i for i, c in enumerate(calls) if c.startswith("rename"))
    assert calls[:first_rename].count("fsync") >= 3  # state.pt, manifest, directory
    assert calls[first_rename + 1] == "fsync"  # the parent, right after publishing
