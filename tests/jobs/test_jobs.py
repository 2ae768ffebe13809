"""Whole jobs as a user starts them: how they end, what they print, how fast they fail."""

import os
import re

import pytest
from jobs_util import job_segments, launcher_kind
from reports import the_report

# Seconds within which a failed job must have ended, start-up of 3 ranks on 2 busy cores
# included: far below HPCDDP_TIMEOUT's default (600 s), so an end that waited for a
# timeout fails the test, and far above a start-up slowed by a busy machine.
FAIL_FAST = 45.0


def _reported(tmp_path):
    return {"HPCDDP_REPORT_DIR": str(tmp_path)}


def test_exception_on_one_rank_aborts_the_whole_job(run_job, tmp_path):
    job = run_job(["tests/jobs/scripts/raise_on_rank1.py"], n=3, timeout=60,
                  env=_reported(tmp_path))
    assert not job.timed_out and job.returncode != 0
    assert job.seconds < FAIL_FAST, f"took {job.seconds:.1f}s to fail"
    report = the_report(tmp_path, "exception", job.output)
    assert (report["rank"], report["size"], report["code"]) == (1, 3, 1)
    assert report["exception"] == {"type": "ValueError",
                                   "message": "deliberate failure on rank one"}
    assert "ValueError: deliberate failure on rank one" in job.stderr  # the traceback
    assert f"hpcddp: rank 1 of 3 on {report['host']}: {report['message']}" in job.stderr
    assert "must not happen" not in job.stdout


def test_without_the_abort_hook_the_watchdog_still_ends_the_job(run_job, tmp_path):
    # With the hook off, rank 1 exits normally after its traceback; the rank waiting in
    # the barrier learns that rank 1 has left without reaching it, and ends the job.
    job = run_job(["tests/jobs/scripts/raise_on_rank1.py"], n=2, timeout=60,
                  env=dict(_reported(tmp_path), HPCDDP_ABORT_ON_ERROR="0"))
    assert not job.timed_out and job.returncode != 0
    assert job.seconds < FAIL_FAST, f"took {job.seconds:.1f}s to fail"
    assert "uncaught exception" not in job.stderr  # the hook did not act
    report = the_report(tmp_path, "wait", job.output)
    assert (report["rank"], report["reason"], report["departed"]) == (0, "departed", [1])
    assert f"hpcddp: rank 0 of 2 on {report['host']}: {report['message']}" in job.stderr


def test_failing_test_on_one_rank_ends_the_pytest_job(run_job, tmp_path):
    job = run_job(["-m", "pytest", "-q", "-p", "hpcddp.testing",
                   "tests/jobs/scripts/case_fails_on_one_rank.py"], n=2, timeout=90,
                  env=_reported(tmp_path))
    assert job.returncode != 0
    assert job.seconds < FAIL_FAST, f"took {job.seconds:.1f}s to fail"
    report = the_report(tmp_path, "test", job.output)
    assert report["rank"] == 1 and "case_fails_on_one_rank.py::" in report["test"]
    assert f"hpcddp: rank 1 of 2 on {report['host']}: {report['message']}" in job.stderr
    assert "deliberate assertion failure on rank one" in job.output


def test_a_thread_dying_inside_a_test_ends_the_job_with_its_output(run_job, tmp_path):
    # pytest holds what a test prints (and hpcddp's abort message) in its capture; an
    # abort from a helper thread ends the process before pytest would print it.
    job = run_job(["-m", "pytest", "-q", "-p", "hpcddp.testing",
                   "tests/jobs/scripts/case_thread_dies.py"], n=2, timeout=90,
                  env=_reported(tmp_path))
    assert job.returncode != 0 and not job.timed_out, job.output
    report = the_report(tmp_path, "exception", job.output)
    assert report["rank"] == 1 and report["thread"] == "helper", report
    assert f"hpcddp: rank 1 of 2 on {report['host']}: uncaught exception in thread " \
           f"'helper'" in job.stderr, job.output
    assert "LookupError: deliberate failure in a helper thread" in job.stderr, job.output
    assert "[rank 1] captured line of rank 1" in job.stdout, job.output


def test_failing_test_after_a_reinit_still_ends_the_job(run_job, tmp_path):
    job = run_job(["-m", "pytest", "-q", "-p", "hpcddp.testing",
                   "tests/jobs/scripts/case_fails_after_reinit.py"], n=2, timeout=90,
                  env=_reported(tmp_path))
    assert job.returncode != 0 and not job.timed_out
    assert job.seconds < FAIL_FAST, f"took {job.seconds:.1f}s to fail"
    report = the_report(tmp_path, "test", job.output)
    assert report["rank"] == 1 and "after a re-init" in job.output


@pytest.mark.parametrize("variable, fix", [
    ("SLURM_STEP_NUM_TASKS", "srun --mpi=pmi2"),
    ("OMPI_COMM_WORLD_SIZE", "different MPI"),
])
def test_singleton_launch_is_refused_with_the_fix(run_job, variable, fix):
    # The launcher variable is set by hand: a real `srun --mpi=none` job is in the
    # Slurm tests. Here each process is a real MPI singleton.
    job = run_job(["tests/jobs/scripts/show_world.py"], env={variable: "2"}, timeout=60)
    assert job.returncode != 0
    assert f"MPI world size is 1 but {variable}=2" in job.stderr and fix in job.stderr


def test_serial_command_inside_a_multitask_allocation_runs(run_job):
    job = run_job(["tests/jobs/scripts/show_world.py"],
                  env={"SLURM_NTASKS": "4", "SLURM_JOB_ID": "1"}, timeout=60)
    assert job.returncode == 0, job.stderr
    assert "rank=0 size=1" in job.stdout


def test_a_singleton_leaves_no_shared_memory_behind(run_job):
    """``python train.py`` without a launcher: MPI starts as a singleton. Open MPI 5's
    leaves its 16 MiB segment in /dev/shm even after MPI_Finalize (only its launcher's
    daemon removes it); init() removes the names a rank alone on its node maps, a
    singleton it refuses removes them, and so does an abort."""
    before = job_segments()
    for _ in range(2):
        job = run_job(["tests/jobs/scripts/show_world.py"], timeout=60)
        assert job.returncode == 0 and "rank=0 size=1" in job.stdout, job.output[-2000:]
    # Singletons refused inside a Slurm step of 4 tasks (srun without --mpi): a script,
    # whose error aborts it, and the doctor, which catches the error and exits.
    for argv in (["tests/jobs/scripts/show_world.py"], ["-m", "hpcddp", "doctor"]):
        job = run_job(argv, env={"SLURM_STEP_NUM_TASKS": "4"}, timeout=60)
        assert job.returncode != 0 and "srun --mpi=pmi2" in job.stderr, job.output[-2000:]
    assert job_segments() - before == set()


def test_ranks_and_local_ranks_under_mpiexec(run_job):
    job = run_job(["tests/jobs/scripts/show_world.py"], n=3, timeout=60)
    assert job.returncode == 0, job.stderr
    # Ranks print concurrently: pick the records out, in whatever order they came.
    seen = sorted(re.findall(r"rank=\d+ size=\d+ local_rank=\d+ device=(?:cpu|cuda:\d+)", job.stdout))
    assert seen == [f"rank={r} size=3 local_rank={r} device=cpu" for r in range(3)]


def test_doctor_prints_every_rank_and_bandwidth(run_job):
    job = run_job(["-m", "hpcddp", "doctor", "--max-bytes", "1048576"], n=3, timeout=90)
    assert job.returncode == 0, job.output
    rows = [line for line in job.stdout.splitlines() if re.match(r"^\S+\s+\d+\s+\d+\s+cpu", line)]
    assert [int(row.split()[1]) for row in rows] == [0, 1, 2]
    level = os.environ.get("MPI4PY_RC_THREAD_LEVEL", "multiple")  # make test-serialized
    assert all(level in row and launcher_kind() in row for row in rows), rows
    assert re.search(r"1 MiB\s+[\d.]+ ms\s+[\d.]+ GB/s", job.stdout)
    assert "hpcddp doctor: OK" in job.stdout


def test_doctor_fails_on_a_singleton_launch(run_job):
    job = run_job(["-m", "hpcddp", "doctor"], env={"SLURM_STEP_NUM_TASKS": "4"}, timeout=60)
    assert job.returncode == 2
    assert "PROBLEM" in job.stderr and "srun --mpi=pmi2" in job.stderr


def test_bad_setting_is_reported_on_every_rank(run_job):
    job = run_job(["tests/jobs/scripts/show_world.py"], n=2, timeout=60,
                  env={"HPCDDP_CUDA_AWARE": "perhaps"})
    assert job.returncode != 0
    assert job.stderr.count("HPCDDP_CUDA_AWARE='perhaps'") >= 2


def test_absurd_thread_count_is_refused_on_every_rank(run_job):
    # torch segfaults on 100000 threads; the value is checked against the cores first.
    job = run_job(["tests/jobs/scripts/show_world.py"], n=2, timeout=60,
                  env={"HPCDDP_NUM_THREADS": "100000", "HPCDDP_TIMOUT": "5"})
    assert job.returncode not in (0, 11, -11), job.output
    assert job.seconds < FAIL_FAST, f"took {job.seconds:.1f}s to fail"
    assert job.stderr.count("HPCDDP_NUM_THREADS=100000 asks for more torch threads than "
                            "there are cores") >= 2


def test_misspelled_setting_is_named_once(run_job):
    job = run_job(["tests/jobs/scripts/show_world.py"], n=2, timeout=60,
                  env={"HPCDDP_TIMOUT": "5"})
    assert job.returncode == 0, job.output
    assert job.stderr.count("HPCDDP_TIMOUT is set but is no hpcddp setting") == 1
    assert "did you mean HPCDDP_TIMEOUT?" in job.stderr


def test_helper_threads_need_serialized_and_below_it_give_way_and_say_so(run_job):
    # At FUNNELED no helper thread may call MPI: futures complete on the caller's
    # thread and the progress pump stays off, each with one warning that says why.
    job = run_job(["tests/jobs/scripts/below_multiple.py"], n=2, timeout=90,
                  env={"MPI4PY_RC_THREAD_LEVEL": "funneled"})
    assert job.returncode == 0, job.output
    for rank in (0, 1):
        assert f"rank {rank}: level=funneled at_once=True total=4 notes=2" in job.stdout
    assert "completing futures in the background is off and get_future() waits" in job.stdout
    assert "the progress pump (HPCDDP_PROGRESS_THREAD=1) is off" in job.stdout
    # At SERIALIZED the helpers enter MPI one at a time (hpcddp.comm.serial): both run.
    serialized = run_job(["tests/jobs/scripts/below_multiple.py"], n=2, timeout=90,
                         env={"MPI4PY_RC_THREAD_LEVEL": "serialized"})
    assert serialized.returncode == 0, serialized.output
    for rank in (0, 1):
        assert f"rank {rank}: level=serialized at_once=False total=4 notes=0" in \
            serialized.stdout, serialized.output
    normal = run_job(["tests/jobs/scripts/below_multiple.py"], n=2, timeout=90,
                     env={"MPI4PY_RC_THREAD_LEVEL": "multiple"})
    assert "rank 0: level=multiple" in normal.stdout and "notes=0" in normal.stdout


FREEZE_AT_EXIT = """
import atexit, gc, os
import torch
# One write a line: under PYTHONUNBUFFERED a print of several pieces is several writes,
# and the two ranks' pieces interleave in mpiexec's output.
def say(text):
    os.write(1, (text + "\\n").encode())
atexit.register(lambda: say(f"frozen at exit {gc.get_freeze_count()}"))
import hpcddp
hpcddp.init()
say(f"frozen after init {gc.get_freeze_count()}")
"""


@pytest.mark.parametrize("when", [None, "off"])
def test_the_heap_is_frozen_as_the_job_exits_unless_off(run_job, tmp_path, when):
    # An exit handler registered before init() runs after hpcddp's (last in, first out).
    script = tmp_path / "freeze.py"
    script.write_text(FREEZE_AT_EXIT)
    job = run_job([script], n=2, timeout=120,
                  env={"HPCDDP_GC_FREEZE": when} if when else None)
    assert job.returncode == 0, job.output[-2000:]
    after_init = [int(n) for n in re.findall(r"frozen after init (\d+)", job.stdout)]
    at_exit = [int(n) for n in re.findall(r"frozen at exit (\d+)", job.stdout)]
    assert after_init == [0, 0] and len(at_exit) == 2, job.output[-2000:]
    if when == "off":
        assert at_exit == [0, 0]
    else:
        # torch's objects: what the interpreter's last collections no longer walk.
        assert min(at_exit) > 100_000
