"""No job hangs: each way a rank can go wrong ends the whole job, soon, naming the rank.

Every job runs with a short HPCDDP_TIMEOUT and under a hard timeout of its own; each test
asserts the exit code, how long the job took and what the report means, through the
fields of the JSON report the reporting rank writes (HPCDDP_REPORT_DIR), and that the
report's headline reached stderr. Its wording is tested once, in
tests/unit/test_report_words.py.
"""

import json
import os
import re
import sys

import pytest
from jobs_util import (ROOT, job_sizes, launcher_kind, mpi_flavour, mpich_segments, mpiexec,
                       run_command, segments_left_since)
from reports import read_reports, reports_said, the_report

SIZES = job_sizes()  # 2 and 3 ranks; 2 under the other MPIs and at SERIALIZED

TIMEOUT = 4.0      # HPCDDP_TIMEOUT of the jobs that end at the timeout
STALL = 2.0        # HPCDDP_STALL_WARN
MARGIN = 20.0      # start-up (torch, MPI) and the report
LONG = 60.0        # HPCDDP_TIMEOUT of the jobs that must end without waiting for it
SPAWN = 10.0       # a spawned DataLoader worker per rank imports torch (3 ranks, 2 cores)
ENV = {"HPCDDP_TIMEOUT": str(TIMEOUT), "HPCDDP_STALL_WARN": str(STALL)}
QUICK_ENV = dict(ENV, HPCDDP_TIMEOUT=str(LONG))


def _stuck(run_job, scenario, n, folder, env=None, quick=False):
    """Run stuck.py's ``scenario``; ``quick``: under the long timeout, for a job that must
    end without waiting for it (see _failed_without_waiting)."""
    job = run_job(["tests/jobs/scripts/stuck.py", scenario], n=n, timeout=90,
                  env=dict(QUICK_ENV if quick else ENV, HPCDDP_REPORT_DIR=str(folder),
                           **(env or {})))
    assert not job.timed_out, f"{scenario} hung:\n{job.output[-3000:]}"
    return job


def _said(job, report):
    """The report's headline, naming its rank, reached the job's stderr."""
    head = f"hpcddp: rank {report['rank']} of {report['size']} on {report['host']}: "
    assert head + report["message"] in job.stderr, job.stderr[-3000:]


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


def _failed_without_waiting(job):
    """The job, run under HPCDDP_TIMEOUT=LONG, failed and ended, start-up included,
    before that timeout could have ended it: something other than the timeout did."""
    _failed_within(job, LONG)


@pytest.mark.parametrize("n", SIZES)
def test_healthy_job_ends_cleanly(run_job, n, tmp_path):
    # The control: the watchdog and the leaving handshake end nothing that is well.
    job = _stuck(run_job, "healthy", n, tmp_path)
    assert job.returncode == 0, job.output
    assert job.stdout.count("finished") == n
    assert "hpcddp: rank" not in job.stderr
    assert read_reports(tmp_path) == {}


@pytest.mark.parametrize("n", SIZES)
def test_a_rank_slow_to_close_is_waited_for_not_taken_for_gone(run_job, n, tmp_path):
    # Rank 1 tells the others it is leaving, then takes 1 s (less than the stall
    # warning) to close an owner before its timeline's gather; the others are in that
    # gather all the while. Leaving, they wait for its final count, not its first.
    trace = tmp_path / "trace.json"
    job = _stuck(run_job, "slow_close", n, tmp_path, env={"HPCDDP_TIMELINE": str(trace)})
    assert job.returncode == 0, job.output[-3000:]
    assert job.stdout.count("finished") == n
    assert "hpcddp: rank" not in job.stderr, job.stderr[-3000:]
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["pid"] for e in events} == set(range(n))


@pytest.mark.parametrize("n", SIZES)
def test_uneven_inputs_that_end_name_the_rank_and_suggest_join(run_job, n, tmp_path):
    job = _stuck(run_job, "uneven_exit", n, tmp_path, quick=True)
    _failed_without_waiting(job)
    report = the_report(tmp_path, "wait", job.output)
    _said(job, report)
    others = [r for r in range(n) if r != 1]
    assert (report["rank"], report["reason"], report["departed"]) == (1, "departed", others)
    assert report["uneven"] == [{"rank": r, "model": "DDP model #0", "step": 4,
                                 "this_step": 5, "state": "ended"} for r in others]
    assert "model.join()" in report["fix"]


@pytest.mark.parametrize("n", SIZES)
def test_uneven_inputs_then_a_barrier_end_at_the_timeout(run_job, n, tmp_path):
    job = _stuck(run_job, "uneven_barrier", n, tmp_path)
    _failed_within(job, TIMEOUT + MARGIN)
    # The stall warning, printed once before the timeout (its one wording test).
    assert f"stalled for {STALL:g} s (HPCDDP_STALL_WARN)" in job.stderr
    report = the_report(tmp_path, "wait", job.output)
    _said(job, report)
    assert (report["reason"], report["setting"], report["seconds"]) == \
        ("timeout", "HPCDDP_TIMEOUT", TIMEOUT)
    assert report["not_arrived"] == [1] and report["ranks"]["1"]["state"] == "waiting"
    assert report["uneven"] == [{"rank": 1, "model": "DDP model #0", "step": 5,
                                 "this_step": 4, "state": "waits"}]
    assert "model.join()" in report["fix"]
    assert _left_behind(job) == [], job.output  # the abort left nothing in /dev/shm


@pytest.mark.parametrize("n", SIZES)
def test_rank_in_user_code_is_named_with_its_stack(run_job, n, tmp_path):
    job = _stuck(run_job, "sleep", n, tmp_path)
    _failed_within(job, TIMEOUT + MARGIN)
    report = the_report(tmp_path, "wait", job.output)
    _said(job, report)
    assert (report["reason"], report["seconds"]) == ("timeout", TIMEOUT)
    assert report["wait"]["what"].startswith("allreduce (sum) of 3 float32")
    assert report["not_arrived"] == [1]
    stuck = report["ranks"]["1"]
    assert stuck["state"] == "user code"
    assert "time.sleep(10_000)" in stuck["stack"]  # rank 1's main thread
    assert report["uneven"] == [] and report["fix"] is None


@pytest.mark.parametrize("n", SIZES)
def test_mismatched_collectives_are_named(run_job, n, tmp_path):
    job = _stuck(run_job, "mismatch", n, tmp_path)
    _failed_within(job, TIMEOUT + MARGIN)
    report = the_report(tmp_path, "wait", job.output)
    _said(job, report)
    calls = {0: "allreduce (sum) of float32[3]", 1: "broadcast from rank 0 of float32[3]"}
    mine = calls[min(report["rank"], 1)]
    assert report["wait"]["call"] == mine
    others = report["different_collectives"]
    assert others and all(d["call"] != mine and d["call"] in calls.values() for d in others)
    # MPICH leaves both waiting; Intel MPI completes a broadcast with the allreduce's message
    assert all(d["state"] in ("waits", "completed") for d in others)
    assert "HPCDDP_DEBUG=detail" in report["fix"]


def test_mismatch_check_raises_on_every_rank_at_once(run_job, tmp_path):
    job = _stuck(run_job, "mismatch", 3, tmp_path, env={"HPCDDP_DEBUG": "detail"},
                 quick=True)
    _failed_without_waiting(job)
    report = the_report(tmp_path, "exception", job.output)
    _said(job, report)
    assert report["exception"]["type"] == "CollectiveMismatch"
    # The group's collectives are numbered from its first, the check's own Dup of its
    # communicator; both sides must name the same number.
    message = report["exception"]["message"]
    assert re.search(r"rank 0 issues collective (\d+): allreduce \(sum\) of float32\[3\]; "
                     r"ranks 1,2 issue collective \1: broadcast from rank 0 of float32\[3\]",
                     message), message
    assert not any(r["kind"] == "wait" for r in read_reports(tmp_path).values())  # raised


@pytest.mark.parametrize("code", [3, 0])
@pytest.mark.parametrize("n", SIZES)
def test_rank_that_exits_mid_training_ends_the_job(run_job, n, code, tmp_path):
    job = _stuck(run_job, f"exit{code}", n, tmp_path, quick=True)
    _failed_without_waiting(job)
    report = the_report(tmp_path, "wait", job.output)
    _said(job, report)
    assert (report["reason"], report["departed"]) == ("departed", [1])
    assert report["ranks"]["1"] == {"state": "left"}


@pytest.mark.parametrize("n", SIZES)
def test_rank_killed_mid_step_ends_the_job(run_job, n, tmp_path):
    # The launcher sees the death and ends the job; no rank can speak after SIGKILL, so
    # the message is the launcher's, naming the process.
    job = _stuck(run_job, "sigkill", n, tmp_path, quick=True)
    _failed_without_waiting(job)
    assert "signal 9" in job.output or "Killed" in job.output
    # Every rank died without MPI_Finalize: the MPI's named segment is gone all the same.
    assert "segments before init: " in job.stdout, job.output
    assert _left_behind(job) == [], job.output


@pytest.mark.skipif(mpi_flavour() != "openmpi", reason="process fault tolerance (ULFM) is "
                    "Open MPI's (mpirun --with-ft ulfm); under MPICH and Intel MPI the "
                    "launcher names a killed rank (the test above)")
def test_under_ulfm_the_survivors_name_the_killed_rank_and_its_node(tmp_path):
    """With Open MPI's process fault tolerance on, MPI tells the survivors that rank 1
    died instead of ending them: each names it, and its node, and the job ends."""
    command = [*mpiexec(), "--with-ft", "ulfm", "-n", "3", sys.executable,
               "tests/jobs/scripts/stuck.py", "sigkill"]
    job = run_command(command, env=dict(QUICK_ENV, HPCDDP_REPORT_DIR=str(tmp_path)),
                      timeout=90, cwd=ROOT)
    assert not job.timed_out, job.output[-3000:]
    _failed_without_waiting(job)
    reports = read_reports(tmp_path)
    assert reports and set(reports) <= {0, 2}, reports_said(tmp_path) + job.output[-3000:]
    for report in reports.values():
        assert report["kind"] == "process_failed", reports_said(tmp_path)
        assert report["failed_ranks"] == [1]
        assert report["failed_nodes"] == [{"node": report["host"], "ranks": [1]}]
        _said(job, report)
        assert f"MPI reports rank 1 on node {report['host']} dead" in report["message"]


@pytest.mark.parametrize("n", SIZES)
def test_rank_stuck_in_a_dataloader_worker_is_named(run_job, n, tmp_path):
    job = _stuck(run_job, "loader_worker", n, tmp_path)
    _failed_within(job, TIMEOUT + MARGIN + SPAWN)
    report = the_report(tmp_path, "wait", job.output)
    _said(job, report)
    assert report["not_arrived"] == [1] and report["ranks"]["1"]["state"] == "user code"
    assert "dataloader.py" in report["ranks"]["1"]["stack"]  # waiting for a worker's batch
    assert report["uneven"] == []  # a rank in user code may just be slow


@pytest.mark.parametrize("mode, quick", [("hpcddp", True), ("hpcddp+mpi4py", True),
                                         ("bare", False), ("bare+mpi4py", False)])
def test_rank_that_fails_before_init_ends_the_job(run_job, mode, quick, tmp_path):
    before = mpich_segments()
    job = run_job(["tests/jobs/scripts/fail_before_init.py", mode], n=3, timeout=90,
                  env=dict(QUICK_ENV if quick else ENV, HPCDDP_REPORT_DIR=str(tmp_path)))
    assert not job.timed_out, job.output[-3000:]
    if quick:
        _failed_without_waiting(job)
    else:
        _failed_within(job, TIMEOUT + MARGIN)
    assert "deliberate failure on rank one" in job.stderr  # Python's own traceback
    assert "must not happen" not in job.stdout
    # Ended in MPI_Init, or in an abort before hpcddp.init() removed its name: MPICH's
    # node segment is still named, and the watcher or the abort removes it.
    assert segments_left_since(before) == [], job.output[-3000:]
    if mode.startswith("hpcddp"):  # hpcddp was imported: its hook aborts at once
        report = the_report(tmp_path, "exception", job.output)
        _said(job, report)
        assert (report["rank"], report["size"], report["before_init"]) == (1, 3, True)
        assert report["exception"] == {"type": "ImportError", "message":
                                       "deliberate failure on rank one before hpcddp.init()"}
    elif mode == "bare" and launcher_kind() == "mpirun (Open MPI)":
        # Open MPI's launcher ends the job itself when a rank exits non-zero, and names it
        assert re.search(r"Process name: +\[\S+@\d+,1\]\s+Exit code: +1", job.stderr), job.stderr
    elif mode == "bare":  # MPI never started on rank 1: the others wait in MPI_Init
        assert re.search(r"hpcddp: rank [02] \(PMI_RANK\): MPI_Init did not return within",
                         job.stderr)
    else:  # the others, in hpcddp.init(), find a rank missing
        report = the_report(tmp_path, "startup", job.output)
        _said(job, report)
        assert report["rank"] != 1 and report["setting"] == "HPCDDP_TIMEOUT"


def test_file_truncated_under_the_loader_is_an_error_naming_rank_and_file(run_job, tmp_path):
    job = run_job(["tests/jobs/scripts/truncated_data.py", tmp_path], n=2, timeout=90,
                  env=dict(QUICK_ENV, HPCDDP_REPORT_DIR=str(tmp_path / "reports")))
    _failed_without_waiting(job)
    assert job.returncode != 7, "SIGBUS: the reader touched pages past the file's end"
    report = the_report(tmp_path / "reports", "exception", job.output)
    _said(job, report)
    assert report["exception"]["type"] == "DataFileError"
    assert f"{tmp_path}/train.h5 shrank to 4096 bytes" in report["exception"]["message"]
    assert "read every batch" not in job.stdout
