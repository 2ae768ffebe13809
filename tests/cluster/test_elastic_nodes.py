"""Recovery inside the job across emulated nodes, under Open MPI's ``mpirun --with-ft
ulfm``: an ``hpcddp.elastic`` DDP program (tests/jobs/scripts/elastic_train.py: a commit
every 3 steps, a ``dist.all_reduce`` of its own each step) loses a node while its ranks
compute and reduce, with no pause in the training, and the job goes on at the smaller
size to the parameters of one process trained on every step's global batch (computed
apart, tests/support/elastic_reference.py: a run resumed from any commit at any size
reaches them). The faults: a node's ranks killed while its launcher daemon lives (the
kernel's OOM killer, an operator), a node frozen whole, and a node's link down, which
splits the job: only the side with more than half of the nodes, or half with rank 0's,
goes on (``hpcddp.elastic.quorum``). A node lost with the launcher's daemon ends the job:
Open MPI 5.0's prterun ends every job whose daemon it loses.
"""

import re
import time

import pytest

from cluster_util import ROOT, finish, start_on_nodes, wait_for_line
from elastic_reference import assert_trained_as, elastic_reference
from jobs_util import mpi_flavour
from reports import read_recoveries, read_reports, reports_said

pytestmark = pytest.mark.skipif(
    mpi_flavour() != "openmpi", reason="recovery inside the job needs ULFM, Open MPI's "
    "(make test-cluster-mpi-openmpi); MPICH and Intel MPI end the job (test_faults.py)")

SCRIPT = ROOT / "tests/jobs/scripts/elastic_train.py"
TOTAL = 900          # steps; the fault lands at step FAULT_AT, while the ranks train on
FAULT_AT = 200
DETECT = 3.0         # HPCDDP_ELASTIC_DETECT (the default): a silent rank's heartbeat
ENV = {"HPCDDP_TIMEOUT": "30", "OMP_NUM_THREADS": "1", "ELASTIC_TIMES": "1",
       "ELASTIC_SAY_AT": str(FAULT_AT)}
LAYOUTS = {"2x2": (2, 2), "3x1": (3, 1)}
FIRST_STEP = re.compile(r"^rank (\d+) of (\d+): first step at ([\d.]+)$", re.M)


@pytest.fixture(scope="module")
def reference():
    return elastic_reference(TOTAL)


@pytest.fixture(autouse=True)
def _nothing_left(cluster):
    """A job a failed test leaves (ranks polling for peers, a frozen node's processes)
    is ended before the next test, which it would slow."""
    yield
    cluster.end_jobs()


def _start(cluster, tmp_path, layout):
    nodes, per_node = LAYOUTS[layout]
    proc = start_on_nodes(cluster, [SCRIPT, tmp_path / "ckpt", tmp_path / "params.json", TOTAL],
                          ranks_per_node=per_node, nodes=cluster.nodes[:nodes],
                          env=dict(ENV, HPCDDP_REPORT_DIR=str(tmp_path / "reports")),
                          launcher_args=["--with-ft", "ulfm"])
    seen = wait_for_line(proc, f"at step {FAULT_AT}", timeout=180)
    return proc, seen, nodes * per_node, per_node


def _victims(cluster, per_node):
    """The second node and its ranks (filled node by node)."""
    return cluster.nodes[1], list(range(per_node, 2 * per_node))


def _went_on(job, tmp_path, reference, size, victim, lost, faulted):
    """The survivors went on without ``lost`` (``victim``'s ranks) from one commit, in
    the same job, to the reference's parameters; the seconds from ``faulted`` (Unix
    time) to their first step at the new size."""
    left = size - len(lost)
    reports = tmp_path / "reports"
    recoveries = read_recoveries(reports)
    assert sorted(recoveries) == list(range(left)), reports_said(reports) + job.output[-3000:]
    commits = set()
    for done, in recoveries.values():
        assert (done["lost_ranks"], done["size_before"], done["size_after"]) == \
            (lost, size, left), done
        assert done["lost_nodes"] == [{"node": victim, "ranks": lost}], done
        commits.add((done["commit"], done["values"]["step"]))
    (commit, step), = commits  # every survivor resumed from the same commit
    assert step == 3 * commit and step >= FAULT_AT - 3, commits
    for rank in range(left):
        assert f"rank {rank} of {left} goes on at step {step}" in job.output, job.output[-3000:]
        assert f"rank {rank} finished at step {TOTAL}" in job.output, job.output[-3000:]
    assert_trained_as(tmp_path / "params.json", reference)
    firsts = [float(t) for _, n, t in FIRST_STEP.findall(job.output) if int(n) == left]
    assert len(firsts) == left, job.output[-3000:]
    return max(firsts) - faulted


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_node_whose_ranks_are_killed_costs_a_recovery_not_the_job(
        cluster, tmp_path, reference, layout):
    proc, seen, size, per_node = _start(cluster, tmp_path, layout)
    victim, lost = _victims(cluster, per_node)
    assert cluster.kill_node(victim, launcher_too=False), f"no rank found on {victim}"
    faulted = time.time()
    job = finish(proc, seen, timeout=120)
    assert not job.timed_out and job.returncode == 0, job.output[-4000:]
    took = _went_on(job, tmp_path, reference, size, victim, lost, faulted)
    assert took < 5, f"the first step at the smaller size came {took:.2f} s after the fault"
    assert read_reports(tmp_path / "reports") == {}, reports_said(tmp_path / "reports")


# A silent node on 2 x 2 (the survivors' rank 0 the observer of the silent ranks in the
# failure detector's ring); on 3 x 1, see the test below.
@pytest.mark.parametrize("layout", ["2x2"])
def test_a_frozen_node_costs_a_recovery_and_its_ranks_leave_when_it_wakes(
        cluster, tmp_path, reference, layout):
    proc, seen, size, per_node = _start(cluster, tmp_path, layout)
    victim, lost = _victims(cluster, per_node)
    try:
        assert cluster.freeze_node(victim), f"no process found on {victim}"
        faulted = time.time()
        # The survivors train to the end while the node stays frozen; the launcher waits
        # for its daemon there, so the job ends when the node wakes (a node that never
        # does is ended by prterun's TCP keepalive, docs/elastic.md).
        seen += wait_for_line(proc, "rank 0 finished", timeout=120)
    finally:
        cluster.freeze_node(victim, frozen=False)
    job = finish(proc, seen, timeout=60)
    assert not job.timed_out, job.output[-4000:]
    took = _went_on(job, tmp_path, reference, size, victim, lost, faulted)
    # The detector's ring finds the node's ranks one after another.
    assert took < per_node * DETECT + 5, f"the first step at the smaller size came " \
                                         f"{took:.2f} s after the freeze"
    _left_as_minority(job, tmp_path, lost, may_be_ended=True)


@pytest.mark.parametrize("layout", ["2x2"])
def test_a_link_down_splits_the_job_and_one_side_goes_on(
        healthy, tmp_path, reference, layout):
    cluster = healthy
    proc, seen, size, per_node = _start(cluster, tmp_path, layout)
    victim, lost = _victims(cluster, per_node)
    try:
        cluster.set_link(victim, False)
        faulted = time.time()
        seen += wait_for_line(proc, "rank 0 finished", timeout=120)
    finally:  # the launcher reaches its daemon there again: the job can end
        cluster.set_link(victim, True)
    job = finish(proc, seen, timeout=60)
    assert not job.timed_out, job.output[-4000:]
    took = _went_on(job, tmp_path, reference, size, victim, lost, faulted)
    assert took < per_node * DETECT + 5, f"{took:.2f} s after the link went down"
    # The cut-off side saw the other as failed too, and left: its ranks' exit code.
    assert job.returncode == 3, job.output[-4000:]
    _left_as_minority(job, tmp_path, lost, may_be_ended=False)


def _left_as_minority(job, tmp_path, lost, may_be_ended):
    """``lost``'s ranks did not train on: each left as the smaller side of a split, named
    in its report (by its rank in the whole job), or, ``may_be_ended``, was ended by the
    launcher at the survivors' request before it could see the split."""
    reports = read_reports(tmp_path / "reports")
    assert set(reports) <= set(lost), reports_said(tmp_path / "reports")
    if not may_be_ended:
        assert sorted(reports) == lost, reports_said(tmp_path / "reports") + job.output[-3000:]
    for report in reports.values():
        assert report["kind"] == "minority" and report["code"] == 3, report
        assert report["setting"] == "HPCDDP_ELASTIC_QUORUM", report
        assert "this side, the smaller or the one without rank 0's node, ends" in \
            report["message"], report


def test_a_frozen_node_whose_observer_is_not_rank_0_recovers_or_ends_the_job(
        cluster, tmp_path, reference):
    # 3 x 1, the second node frozen: its rank's observer in Open MPI 5.0's detector ring
    # is rank 2, and the news reaches rank 0 late (a recovery after about 60 s) or rank
    # 2 declares rank 0 failed too and leaves as the smaller side, rank 0 then waiting in
    # MPIX_Comm_shrink for a rank still counted alive. Either way the job may not hang:
    # it goes on to the reference, or the shrink's deadline (HPCDDP_TIMEOUT) ends it.
    proc, seen, size, per_node = _start(cluster, tmp_path, "3x1")
    victim, lost = _victims(cluster, per_node)
    try:
        assert cluster.freeze_node(victim), f"no process found on {victim}"
        faulted = time.monotonic()
        job = finish(proc, seen, timeout=float(ENV["HPCDDP_TIMEOUT"]) + 60)
    finally:
        cluster.freeze_node(victim, frozen=False)
    took = time.monotonic() - faulted
    assert not job.timed_out, f"hung {took:.0f} s:\n{job.timeline[-4000:]}"
    reports = read_reports(tmp_path / "reports")
    if job.returncode == 0:
        _went_on(job, tmp_path, reference, size, victim, lost, 0.0)
        return
    stuck = {r: v for r, v in reports.items() if v["kind"] == "recovery_stuck"}
    assert stuck, reports_said(tmp_path / "reports") + job.output[-4000:]
    assert "MPIX_Comm_shrink did not complete within HPCDDP_TIMEOUT=30 s" in \
        job.output, job.output[-4000:]


def test_a_node_lost_with_the_launchers_daemon_ends_the_job(cluster, tmp_path):
    # Open MPI 5.0.11's prterun ends a job whose daemon it loses ("PRTE has lost
    # communication with a remote daemon"), fault tolerance or not; the batch script's
    # successor resumes from the checkpoint the commits wrote.
    proc, seen, _, per_node = _start(cluster, tmp_path, "2x2")
    victim, _ = _victims(cluster, per_node)
    assert cluster.kill_node(victim), f"no process found on {victim}"
    faulted = time.monotonic()
    job = finish(proc, seen, timeout=60)
    assert not job.timed_out and time.monotonic() - faulted < 20, job.output[-4000:]
    # (lost communication with a remote daemon, or: one failed to report back)
    assert re.search(rf"Remote (daemon|host):.* {victim}\b", job.output), job.output[-4000:]
    assert "rank 0 finished" not in job.output, job.output[-4000:]
    assert (tmp_path / "ckpt").is_dir(), "no checkpoint for the next job to resume from"
