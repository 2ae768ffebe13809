"""No job hangs: each way a rank can go wrong ends the whole job, soon, naming the rank.

Every job runs with a short HPCDDP_TIMEOUT and under a hard timeout of its own; each test
asserts the exit code, the message and how long the job took.
"""

import os
import re

import pytest

TIMEOUT = 4.0      # HPCDDP_TIMEOUT of the jobs
STALL = 2.0        # HPCDDP_STALL_WARN
MARGIN = 20.0      # start-up (torch, MPI) and the report
QUICK = 15.0       # a job that must end without waiting for the timeout
ENV = {"HPCDDP_TIMEOUT": str(TIMEOUT), "HPCDDP_STALL_WARN": str(STALL)}


def _stuck(run_job, scenario, n, env=None):
    job = run_job(["tests/jobs/scripts/stuck.py", scenario], n=n, timeout=90,
                  env=dict(ENV, **(env or {})))
    assert not job.timed_out, f"{scenario} hung:\n{job.output[-3000:]}"
    return job


def _left_behind(job):
    """The shared-memory files the ranks mapped under a name at MPI_Init that still
    exist after the job (MPICH names its node segment until MPI_Finalize)."""
    named = {path for line in job.stdout.splitlines()
             if line.startswith("segments before init: ")
             for path in line.split(": ", 1)[1].split() if path != "-"}
    return sorted(p for p in named if os.path.exists(p))


def _failed_within(job, seconds):
    """The job failed (non-zero exit) and ended within ``seconds``."""
    assert job.returncode != 0, job.output[-3000:]
    assert job.seconds < seconds, f"took {job.seconds:.1f} s"


@pytest.mark.parametrize("n", [2, 3])
def test_healthy_job_ends_cleanly(run_job, n):
    # The control: the watchdog and the leaving handshake end nothing that is well.
    job = _stuck(run_job, "healthy", n)
    assert job.returncode == 0, job.output
    assert job.stdout.count("finished") == n
    assert "hpcddp: rank" not in job.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_uneven_inputs_that_end_name_the_rank_and_suggest_join(run_job, n):
    job = _stuck(run_job, "uneven_exit", n)
    _failed_within(job, QUICK)
    assert f"hpcddp: rank 1 of {n}" in job.stderr
    others = "rank 0" if n == 2 else "ranks 0,2"
    assert f"{others} left the job before reaching it" in job.stderr
    assert "ended at step 4 of DDP model #0 where this rank is at step 5" in job.stderr
    assert "with model.join():" in job.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_uneven_inputs_then_a_barrier_end_at_the_timeout(run_job, n):
    job = _stuck(run_job, "uneven_barrier", n)
    _failed_within(job, TIMEOUT + MARGIN)
    assert f"stalled for {STALL:g} s (HPCDDP_STALL_WARN)" in job.stderr
    assert "Not arrived: rank 1." in job.stderr
    assert "rank 1 waits at step 5 of DDP model #0 where this rank is at step 4" in job.stderr
    assert "with model.join():" in job.stderr
    assert _left_behind(job) == [], job.output  # the abort left nothing in /dev/shm


@pytest.mark.parametrize("n", [2, 3])
def test_rank_in_user_code_is_named_with_its_stack(run_job, n):
    job = _stuck(run_job, "sleep", n)
    _failed_within(job, TIMEOUT + MARGIN)
    assert f"no progress for {TIMEOUT:.0f} s (HPCDDP_TIMEOUT={TIMEOUT:g})" in job.stderr
    assert "it waits in allreduce (sum) of 3 float32" in job.stderr
    assert "Not arrived: rank 1." in job.stderr
    assert "rank 1 is in user code" in job.stderr
    assert "time.sleep(10_000)" in job.stderr  # rank 1's main-thread stack


@pytest.mark.parametrize("n", [2, 3])
def test_mismatched_collectives_are_named(run_job, n):
    job = _stuck(run_job, "mismatch", n)
    _failed_within(job, TIMEOUT + MARGIN)
    assert "the ranks issued different collectives" in job.stderr
    assert re.search(r"rank 0 waits in allreduce \(sum\) of float32\[3\]|rank 1 waits in "
                     r"broadcast from rank 0 of float32\[3\]", job.stderr)


def test_mismatch_check_raises_on_every_rank_at_once(run_job):
    job = _stuck(run_job, "mismatch", 3, env={"HPCDDP_DEBUG": "detail"})
    _failed_within(job, QUICK)
    assert "CollectiveMismatch" in job.stderr
    assert ("rank 0 issues collective 1: allreduce (sum) of float32[3]; ranks 1,2 issue "
            "collective 1: broadcast from rank 0 of float32[3]") in job.stderr
    assert "no progress for" not in job.stderr  # raised, not timed out


@pytest.mark.parametrize("code", [3, 0])
@pytest.mark.parametrize("n", [2, 3])
def test_rank_that_exits_mid_training_ends_the_job(run_job, n, code):
    job = _stuck(run_job, f"exit{code}", n)
    _failed_within(job, QUICK)
    assert "rank 1 left the job before reaching it" in job.stderr
    assert "rank 1 has left the job (its script ended, or called sys.exit)" in job.stderr


@pytest.mark.parametrize("n", [2, 3])
def test_rank_killed_mid_step_ends_the_job(run_job, n):
    # The launcher sees the death and ends the job; no rank can speak after SIGKILL, so
    # the message is the launcher's, naming the process.
    job = _stuck(run_job, "sigkill", n)
    _failed_within(job, QUICK)
    assert "signal 9" in job.output or "Killed" in job.output
    # Every rank died without MPI_Finalize: the MPI's named segment is gone all the same.
    assert "segments before init: " in job.stdout, job.output
    assert _left_behind(job) == [], job.output


@pytest.mark.parametrize("n", [2, 3])
def test_rank_stuck_in_a_dataloader_worker_is_named(run_job, n):
    job = _stuck(run_job, "loader_worker", n)
    _failed_within(job, TIMEOUT + MARGIN)
    assert "Not arrived: rank 1." in job.stderr
    assert "rank 1 is in user code" in job.stderr
    assert "dataloader.py" in job.stderr  # its stack: waiting for a worker's batch
    assert "Uneven inputs" not in job.stderr  # a rank in user code may just be slow


@pytest.mark.parametrize("mode, quick", [("hpcddp", True), ("hpcddp+mpi4py", True),
                                         ("bare", False), ("bare+mpi4py", False)])
def test_rank_that_fails_before_init_ends_the_job(run_job, mode, quick):
    job = run_job(["tests/jobs/scripts/fail_before_init.py", mode], n=3, timeout=90, env=ENV)
    assert not job.timed_out, job.output[-3000:]
    _failed_within(job, QUICK if quick else TIMEOUT + MARGIN)
    assert "deliberate failure on rank one" in job.stderr
    assert "must not happen" not in job.stdout
    if mode.startswith("hpcddp"):  # hpcddp was imported: its hook aborts at once
        assert "hpcddp: rank 1 of 3" in job.stderr and "before hpcddp.init()" in job.stderr
    elif mode == "bare":  # MPI never started on rank 1: the others wait in MPI_Init
        assert re.search(r"hpcddp: rank [02] \(PMI_RANK\): MPI_Init did not return within",
                         job.stderr)
    else:
        assert "not every one of the 3 ranks reached hpcddp.init()" in job.stderr


def test_file_truncated_under_the_loader_is_an_error_naming_rank_and_file(run_job, tmp_path):
    job = run_job(["tests/jobs/scripts/truncated_data.py", tmp_path], n=2, timeout=90, env=ENV)
    _failed_within(job, QUICK)
    assert job.returncode != 7, "SIGBUS: the reader touched pages past the file's end"
    assert re.search(r"rank [01]\b.*DataFileError", job.stderr), job.stderr[-3000:]
    assert f"{tmp_path}/train.h5 shrank to 4096 bytes" in job.stderr
    assert "read every batch" not in job.stdout
