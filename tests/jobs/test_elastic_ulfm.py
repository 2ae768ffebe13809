"""Recovery inside the job under ULFM (Open MPI's ``mpirun --with-ft ulfm``): an
``hpcddp.elastic`` DDP program whose rank is killed mid-backward goes on at the smaller
size in the same job, from the newest commit, and ends with the parameters of one
process trained on every step's global batch (computed here: each step's gradient is
the global batch's mean at any size, so a run resumed from a commit at another size
reaches them too). Below ``HPCDDP_ELASTIC_MIN_RANKS`` survivors the job ends, named.
"""

import json
import sys

import pytest
import torch
from jobs_util import ROOT, mpi_flavour, mpiexec, run_command
from reports import read_recoveries, read_reports, reports_said
from elastic_reference import SAMPLES, assert_trained_as, elastic_reference, sampler_reference
from test_elastic_resume import KILL_AT, SCRIPT, TOTAL

pytestmark = pytest.mark.skipif(
    mpi_flavour() != "openmpi", reason="recovery inside the job needs ULFM, Open MPI's "
    "(mpirun --with-ft ulfm); MPICH and Intel MPI end the job (test_elastic_resume.py)")

ENV = {"HPCDDP_TIMEOUT": "60", "OMP_NUM_THREADS": "1"}


def _run(tmp_path, n, env=None):
    out, reports = tmp_path / "params.json", tmp_path / "reports"
    command = [*mpiexec(), "--with-ft", "ulfm", "-n", str(n), sys.executable, str(SCRIPT),
               str(tmp_path / "ckpt"), str(out), str(TOTAL), str(KILL_AT)]
    job = run_command(command, env=dict(ENV, HPCDDP_REPORT_DIR=str(reports), **(env or {})),
                      timeout=120, cwd=ROOT)
    assert not job.timed_out, job.output[-3000:]
    return job, out, reports


def _assert_two_in_turn(recoveries):
    """Each survivor's report: rank 1 lost of 4, then rank 2 of the 3, from commit 2."""
    for first, second in recoveries.values():
        assert (first["lost_ranks"], first["size_before"], first["size_after"]) == ([1], 4, 3)
        assert (second["lost_ranks"], second["size_before"], second["size_after"]) == \
            ([2], 3, 2)
        assert second["commit"] == 2


def _assert_rank_one_lost(job, out, reports, n):
    """The job went on without rank 1 of ``n`` from the commit of step 6, in the same
    job, to the reference's parameters; each survivor's recovery (returned by rank)."""
    assert job.returncode == 0, job.output[-4000:]
    for rank in range(n - 1):
        assert f"rank {rank} of {n - 1} goes on at step 6" in job.stdout, job.output[-3000:]
        assert f"rank {rank} finished at step {TOTAL}" in job.stdout, job.output[-3000:]
    assert read_reports(reports) == {}, reports_said(reports)  # nothing ended the job
    recoveries = read_recoveries(reports)
    assert sorted(recoveries) == list(range(n - 1)), recoveries
    for done, in recoveries.values():
        assert (done["lost_ranks"], done["size_before"], done["size_after"]) == ([1], n, n - 1)
        assert (done["commit"], done["values"]) == (2, {"step": 6})
    assert_trained_as(out, elastic_reference(TOTAL))
    return {rank: done for rank, (done,) in recoveries.items()}


@pytest.mark.parametrize("n", [3, 4])
def test_a_killed_rank_costs_a_recovery_not_the_job(tmp_path, n):
    job, out, reports = _run(tmp_path, n)
    # Commits at steps 3 and 6; rank 1 dies in step 8's backward: the survivors go on
    # from step 6, one rank fewer, in the same job.
    recoveries = _assert_rank_one_lost(job, out, reports, n)
    assert f"hpcddp: rank 1 of {n} died" in job.stderr, job.stderr[-3000:]
    before = [r for r in range(n) if r != 1]
    for rank, done in recoveries.items():
        assert done["lost_nodes"] == [{"node": done["lost_nodes"][0]["node"], "ranks": [1]}]
        assert done["rank_before"] == before[rank]


def _two_went_on(job, reports):
    """Of 4 ranks, the two left went on from step 6 to the end; their recoveries."""
    assert job.returncode == 0, job.output[-4000:]
    for rank in range(2):
        assert f"rank {rank} of 2 goes on at step 6" in job.stdout, job.output[-3000:]
        assert f"rank {rank} finished at step {TOTAL}" in job.stdout, job.output[-3000:]
    recoveries = read_recoveries(reports)
    assert sorted(recoveries) == [0, 1], recoveries
    return recoveries


def test_a_rank_that_dies_during_the_recovery_costs_a_second_one(tmp_path):
    # Of 4 ranks, rank 1 dies mid-backward; then, inside the recovery (in the reset
    # callbacks, after the survivors shrank and restored), the survivors' rank 2 dies.
    job, out, reports = _run(tmp_path, 4, env={"ELASTIC_KILL_IN_RESET": "2"})
    recoveries = _two_went_on(job, reports)
    _assert_two_in_turn(recoveries)
    assert_trained_as(out, elastic_reference(TOTAL))


def test_a_rank_that_dies_inside_the_recoverys_collective_costs_one_recovery_of_both(
        tmp_path):
    # Of 4 ranks, rank 1 dies mid-backward; in the recovery's reset callbacks, which
    # make a collective, the survivors' rank 2 dies first: their collective fails, the
    # recovery is made again on the two left, and its report counts both dead ranks
    # against the world it began from.
    job, out, reports = _run(tmp_path, 4, env={"ELASTIC_KILL_IN_RESET": "2",
                                               "ELASTIC_RESET_COLLECTIVE": "1"})
    recoveries = _two_went_on(job, reports)
    for rank, (done,) in recoveries.items():
        # rank 2 of the 3 survivors was rank 3 of the 4
        assert (done["lost_ranks"], done["size_before"], done["size_after"]) == \
            ([1, 3], 4, 2), done
        assert (done["rank_before"], done["commit"]) == ([0, 2][rank], 2), done
    assert_trained_as(out, elastic_reference(TOTAL))


def test_below_the_minimum_size_the_job_ends_and_names_the_dead_rank(tmp_path):
    job, out, reports = _run(tmp_path, 3, env={"HPCDDP_ELASTIC_MIN_RANKS": "3"})
    assert job.returncode != 0, job.output[-3000:]
    assert not out.exists() and "finished" not in job.stdout
    found = read_reports(reports)
    assert found and set(found) <= {0, 1}, reports_said(reports) + job.output[-3000:]
    for report in found.values():
        assert (report["kind"], report["failed_ranks"], report["setting"]) == \
            ("process_failed", [1], "HPCDDP_ELASTIC_MIN_RANKS")
        assert "rank 1 died and 2 ranks are left" in report["message"], report["message"]


HOROVOD_SCRIPT = ROOT / "tests/jobs/scripts/horovod_elastic_train.py"


def _run_horovod(tmp_path, n, env=None):
    out, reports = tmp_path / "params.json", tmp_path / "reports"
    command = [*mpiexec(), "--with-ft", "ulfm", "-n", str(n), sys.executable,
               str(HOROVOD_SCRIPT), str(out), str(KILL_AT)]
    # The program imports horovod.torch: the alias, as `python -m hpcddp.horovod
    # install-alias` puts it (test_horovod_alias.py installs it for real).
    env = dict(ENV, HPCDDP_REPORT_DIR=str(reports), PYTHONPATH=str(ROOT / "hpcddp/horovod/alias"),
               **(env or {}))
    job = run_command(command, env=env, timeout=120, cwd=ROOT)
    assert not job.timed_out, job.output[-3000:]
    return job, out, reports


@pytest.mark.parametrize("n", [4])  # 3 ranks: the DDP program's case above
def test_a_horovod_elastic_program_goes_on_without_the_killed_rank(tmp_path, n):
    # One row per rank and step of 48, commits every 3 steps; rank 1 dies in step 8's
    # backward: the survivors go on from step 6, the sampler dealing the rows left.
    job, out, reports = _run_horovod(tmp_path, n)
    assert job.returncode == 0, job.output[-4000:]
    steps = 6 + (SAMPLES - 6 * n) // (n - 1)
    for rank in range(n - 1):
        assert f"rank {rank} of {n - 1} goes on at step 6" in job.stdout, job.output[-3000:]
        assert f"rank {rank} finished at step {steps}, resets at sizes [{n - 1}]" in \
            job.stdout, job.output[-3000:]
    assert f"hpcddp: rank 1 of {n} died" in job.stderr, job.stderr[-3000:]
    assert read_reports(reports) == {}, reports_said(reports)
    recoveries = read_recoveries(reports)
    assert sorted(recoveries) == list(range(n - 1)), recoveries
    for rank, (done,) in recoveries.items():
        assert (done["lost_ranks"], done["size_before"], done["size_after"]) == ([1], n, n - 1)
        assert (done["commit"], done["values"]) == (2, {"step": 6})
    assert_trained_as(out, sampler_reference(n, n - 1))


def test_a_horovod_rank_that_dies_in_the_reset_callback_costs_a_second_recovery(tmp_path):
    # Of 4 ranks, rank 1 dies mid-backward; then, in the reset callback after the first
    # recovery, the survivors' rank 2 dies: the sync that follows costs a second one.
    job, out, reports = _run_horovod(tmp_path, 4, env={"ELASTIC_KILL_IN_RESET": "2"})
    assert job.returncode == 0, job.output[-4000:]
    for rank in range(2):
        assert f"rank {rank} of 2 goes on at step 6" in job.stdout, job.output[-3000:]
        assert f"rank {rank} finished at step {6 + (SAMPLES - 24) // 2}, resets at sizes " \
               f"[3, 2]" in job.stdout, job.output[-3000:]
    recoveries = read_recoveries(reports)
    # Rank 2 of the three wrote its report of the first recovery before it died.
    assert sorted(recoveries) == [0, 1, 2] and len(recoveries.pop(2)) == 1, recoveries
    _assert_two_in_turn(recoveries)
    assert_trained_as(out, sampler_reference(4, 2))


def test_a_sharded_loader_made_before_run_deals_the_rest_of_the_epoch_to_the_survivors(
        tmp_path):
    # 48 samples, one per rank and step: 4 ranks take 4 a step. Commits at steps 3, 6;
    # rank 1 dies at step 7, so the survivors go on from step 6 (24 samples taken) and
    # deal the other 24 among 3 ranks: 8 more steps.
    import h5py
    import numpy as np
    data, record = tmp_path / "data.h5", tmp_path / "taken"
    with h5py.File(data, "w") as f:
        f["x"] = np.arange(48, dtype=np.float32).reshape(48, 1)
    command = [*mpiexec(), "--with-ft", "ulfm", "-n", "4", sys.executable,
               str(ROOT / "tests/jobs/scripts/elastic_loader.py"), str(data), str(record), "7"]
    job = run_command(command, env=ENV, timeout=120, cwd=ROOT)
    assert not job.timed_out and job.returncode == 0, job.output[-4000:]
    for rank in range(3):
        assert f"rank {rank} of 3 finished at step 14" in job.stdout, job.output[-3000:]
    lines = [json.loads(line) for path in sorted(tmp_path.glob("taken.*"))
             for line in path.read_text().splitlines()]
    # What counts: the steps before the commit resumed from, and those after the recovery.
    kept = [line for line in lines if (line["recoveries"], line["size"]) == (1, 3)
            or (line["recoveries"] == 0 and line["step"] < 6)]
    taken = sorted(i for line in kept for i in line["taken"])
    assert taken == list(range(48)), taken  # every sample of the epoch once
    # Before the fault, rank 0's share is torch's DistributedSampler's.
    order = list(torch.utils.data.DistributedSampler(range(48), num_replicas=4, rank=0,
                                                     shuffle=True, seed=3))
    rank0 = [json.loads(line) for line in (tmp_path / "taken.0").read_text().splitlines()]
    assert [line["taken"][0] for line in rank0 if line["recoveries"] == 0][:6] == order[:6]


def test_a_frozen_rank_is_declared_failed_by_the_detector_and_ended_by_the_launcher(tmp_path):
    # Rank 1 stops itself (SIGSTOP) in step 8's backward: alive, silent. Open MPI's
    # failure detector (HPCDDP_ELASTIC_DETECT, 3 s) declares it failed, the survivors go
    # on from step 6, and rank 0 has the launcher end it, so the job ends when they
    # finish. Without the detector the survivors would wait on it until HPCDDP_TIMEOUT
    # (60 s) ended the job; without the launcher's end, mpirun would wait for it.
    job, out, reports = _run(tmp_path, 3, env={"ELASTIC_SIGNAL": "SIGSTOP"})
    recoveries = _assert_rank_one_lost(job, out, reports, 3)
    assert recoveries[0]["ended_by_launcher"] is True, recoveries


def test_a_rank_busy_before_init_beyond_the_detectors_timeout_is_not_declared_failed():
    # 8 s of Python on rank 1 between MPI_Init and hpcddp.init(), past the detector's
    # 3 s: hpcddp's heartbeat thread keeps MPI's progress (and so the heartbeats) going.
    command = [*mpiexec(), "--with-ft", "ulfm", "-n", "3", sys.executable,
               str(ROOT / "tests/jobs/scripts/late_init.py"), "8"]
    job = run_command(command, env=ENV, timeout=120, cwd=ROOT)
    assert not job.timed_out and job.returncode == 0, job.output[-4000:]
    for rank in range(3):
        assert f"rank {rank} sum 3" in job.stdout, job.output[-3000:]


def test_a_rank_stuck_in_its_own_code_is_ended_at_the_timeout_and_the_others_go_on(tmp_path):
    # Rank 1 loops in Python in step 8's backward: alive, its heartbeats going on, so
    # MPI never fails it. At HPCDDP_TIMEOUT (5 s) the others' watchdogs find it missing
    # from the DDP collective and have the launcher end it; the survivors then recover
    # as from a dead rank. Without it the watchdog would end the job.
    job, out, reports = _run(tmp_path, 3, env={"ELASTIC_SIGNAL": "stuck",
                                               "HPCDDP_TIMEOUT": "5"})
    _assert_rank_one_lost(job, out, reports, 3)
    assert "rank 1 had not reached DDP" in job.stderr and "ended through the launcher" \
        in job.stderr, job.stderr[-3000:]


def test_a_revoke_while_a_communicator_is_being_made_leaves_that_one_alone():
    # A recovery revokes every communicator hpcddp holds, from whichever thread meets
    # the failure, also while a rebuild's MPI_Comm_idup is pending (a failure noted
    # during the recovery). Open MPI 5.0.11 crashes revoking one still being made
    # (SIGSEGV in mca_pml_ob1_revoke_comm), and mpirun --with-ft ulfm carries on past a
    # crashed rank: each rank's line is the check.
    command = [*mpiexec(), "--with-ft", "ulfm", "-n", "2", sys.executable,
               str(ROOT / "tests/jobs/scripts/revoke_while_made.py")]
    job = run_command(command, env=ENV, timeout=60, cwd=ROOT)
    assert not job.timed_out and job.returncode == 0, job.output[-4000:]
    assert "rank 0: MPI_ERR" in job.stdout, job.output[-4000:]  # its dup failed, no crash
    assert "rank 1: MPI_ERR_REVOKED" in job.stdout, job.output[-4000:]
    assert "Segmentation fault" not in job.output, job.output[-4000:]
