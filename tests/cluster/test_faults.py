"""Faults across nodes, each in the middle of training on two nodes x two ranks: a node
whose ranks are all killed, a node lost with everything on it, a node whose link goes
down, and a node whose link is shaped to a crawl. Each ends the whole job within
HPCDDP_TIMEOUT plus 30 s, and a message names the node where anything can (the launcher,
or hpcddp's watchdog); the last checkpoint stays loadable, and a rerun on the healthy
cluster resumes from it and ends with the parameters of an uninterrupted run."""

import glob
import re
import time

import pytest

from cluster_util import finish, on_nodes, start_on_nodes, wait_for_line
from hpcddp.commands.lost import lost_nodes
from jobs_util import mpi_flavour
from reports import reports_said, the_report
from train_output import parameters_digest

FLAVOUR = mpi_flavour()
# What each launcher says of the killed ranks: MPICH's hydra names the node and the
# process (PID), not the rank; Intel MPI's hydra also the rank and the signal.
KILLED_LINE = {"mpich": r"PID \d+ RUNNING AT {node}\s+=\s+EXIT CODE: 9",
               "impi": r"RANK [23] PID \d+ RUNNING AT {node}\s+=\s+KILLED BY SIGNAL: 9",
               "openmpi": r"rank [23] with PID \d+ on node {node} exited on\s+signal 9"}
TIMEOUT = 10                     # HPCDDP_TIMEOUT of the jobs
LIMIT = TIMEOUT + 30             # the bound on a report after a fault
ENV = {"HPCDDP_TIMEOUT": str(TIMEOUT)}
SCRIPT = "tests/cluster/scripts/train_steps.py"
STEPS = 30


def _train(cluster, ckpt, steps=STEPS, pause=0.0):
    return [SCRIPT, ckpt, steps, "--every", 5, "--pause", pause]


@pytest.fixture(scope="module")
def uninterrupted(cluster, tmp_path_factory):
    """The parameters of the training run no fault touched (the same 2x2 layout)."""
    job = on_nodes(cluster, _train(cluster, tmp_path_factory.mktemp("ref") / "ckpt"),
                   ranks_per_node=2, nodes=cluster.nodes[:2], env=ENV)
    assert job.returncode == 0, job.output[-4000:]
    return parameters_digest(job.stdout)


def _session_left(pid):
    """What the launcher left in /tmp under its PID: prterun's session directory, which
    stops a later prterun given the same PID from starting (exit 213)."""
    return [path for path in glob.glob(f"/tmp/*.{pid}") if glob.glob(f"{path}/pmix.*.{pid}")]


def _ranks_killed(cluster, node):
    assert cluster.kill_node(node, launcher_too=False), f"no process found in {node}"


def _node_lost(cluster, node):
    assert cluster.kill_node(node), f"no process found in {node}"


def _link_down(cluster, node):
    cluster.set_link(node, False)


def _crawl(cluster, node):
    cluster.shape(node, "8kbit")


FAULTS = {"ranks_killed": _ranks_killed, "node_lost": _node_lost, "link_down": _link_down,
          "link_crawls": _crawl}


@pytest.mark.parametrize("fault", FAULTS)
def test_fault_ends_the_job_then_a_rerun_resumes(healthy, uninterrupted, tmp_path, fault):
    cluster = healthy
    victim = cluster.nodes[1]
    ckpt = tmp_path / "ckpt"
    # A pause per step keeps training going long enough for the fault to land mid-run.
    reports = tmp_path / "reports"
    proc = start_on_nodes(cluster, _train(cluster, ckpt, steps=10_000, pause=0.1),
                          ranks_per_node=2, nodes=cluster.nodes[:2],
                          env=dict(ENV, HPCDDP_REPORT_DIR=str(reports)))
    seen = wait_for_line(proc, "step 12", timeout=180)
    FAULTS[fault](cluster, victim)
    faulted = time.monotonic()
    job = finish(proc, seen, timeout=LIMIT + 60)
    took = time.monotonic() - faulted
    assert not job.timed_out, f"{fault}: the job hung:\n{job.output[-4000:]}"
    # Open MPI 5.0.11's prterun, having lost a node's daemon, says it ends the job and
    # then exits 0 in most runs here (8 of 11; below: an expected failure when it does).
    lost_daemon_exit_0 = (FLAVOUR == "openmpi" and fault == "node_lost"
                          and job.returncode == 0)
    assert job.returncode != 0 or lost_daemon_exit_0, job.output[-4000:]
    assert took <= LIMIT, (f"{fault}: ended {took:.0f} s after the fault; its lines, "
                          f"seconds after it:\n{job.timeline[-4000:]}")
    assert _session_left(proc.pid) == [], job.output[-4000:]  # also when hpcddp ended it
    # The node and its ranks are named: by the launcher when the ranks died, by hpcddp's
    # watchdog when they live on behind a link that no longer carries them. A node lost
    # with the launcher's proxy on it ends the job at once; hydra's proxies then SIGKILL
    # every other rank, so only the launcher can speak, and MPICH's does not name the node.
    if fault == "ranks_killed":
        assert re.search(KILLED_LINE[FLAVOUR].format(node=victim), job.output), job.output
    elif fault == "node_lost":
        assert took < TIMEOUT, f"took {took:.0f} s: the launcher should have seen it at once"
        if FLAVOUR == "openmpi":  # the only words: prterun's, naming the lost node
            # (lost communication with a remote daemon, or: one failed to report back)
            assert re.search(rf"Remote (daemon|host):.* {victim}\b", job.output), job.output
    else:
        # Rank 0's side reports (the lowest rank's report), naming the silent node; over
        # a crawling link the ranks' answers may get through, late: then the slow node.
        report = the_report(reports, "wait", job.output)
        assert report["rank"] in (0, 1), f"{reports_said(reports)}\n{job.output[-4000:]}"
        assert (report["reason"], report["seconds"]) == ("timeout", float(TIMEOUT))
        named = report["silent_nodes"] + ([{"node": n["node"], "ranks": n["ranks"]}
                                           for n in report["slow_nodes"]]
                                          if fault == "link_crawls" else [])
        assert named == [{"node": victim, "ranks": [2, 3]}], report
        assert f"hpcddp: rank {report['rank']} of 4 on {report['host']}: " in job.output
        # The far side sees rank 0's node silent too; it leaves the report to rank 0's,
        # and ends itself 10 s later only if nothing has ended it: Open MPI's order to
        # end it crawls over a link at 8 kbit/s too, and its report may still get through.
        far = job.output.find(f"No rank on node {cluster.nodes[0]}")
        near = job.output.find(f"hpcddp: rank {report['rank']} of 4 on {report['host']}: ")
        assert far == -1 or far > near, job.output

    # What a batch script that heals the job is told to leave out (hpcddp lost): the
    # victim, never a healthy node; named in every case but a node lost under hydra, whose
    # launcher does not name it (Slurm then sees the node down itself).
    lost = [item["node"] for item in lost_nodes(reports, job.output)]
    assert lost == [victim] or (fault == "node_lost" and lost == []), \
        f"hpcddp lost named {lost}\n{reports_said(reports)}\n{job.output[-4000:]}"

    for node in cluster.nodes:  # the healthy cluster again
        cluster.set_link(node, True)
        cluster.shape(node, None)
    rerun = on_nodes(cluster, _train(cluster, ckpt), ranks_per_node=2,
                     nodes=cluster.nodes[:2], env=ENV)
    assert rerun.returncode == 0, rerun.output[-4000:]
    resumed = re.search(r"resumed at step (\d+)", rerun.stdout)
    assert resumed and int(resumed.group(1)) >= 10, rerun.stdout[-2000:]
    assert parameters_digest(rerun.stdout) == uninterrupted
    if lost_daemon_exit_0:
        pytest.xfail("Open MPI 5.0.11: prterun exits 0 after 'PRTE has lost communication "
                     "with a remote daemon ... will terminate the job' (reproducer: this "
                     "test under make test-cluster-mpi-openmpi; PRRTE's exit status was "
                     "reworked upstream in openpmix/prrte#2603)")


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_watchdog_names_the_stuck_rank_and_its_node(cluster, level, tmp_path):
    # rank 1, alone on the second node, sleeps in user code while the others wait (one
    # rank on each node: 3, or 8 under make test-cluster-8).
    job = on_nodes(cluster, ["tests/jobs/scripts/stuck.py", "sleep"], ranks_per_node=1,
                   nodes=cluster.nodes, timeout=120,
                   env={"HPCDDP_TIMEOUT": "4", "HPCDDP_STALL_WARN": "2",
                        "MPI4PY_RC_THREAD_LEVEL": level, "HPCDDP_REPORT_DIR": str(tmp_path)})
    assert not job.timed_out and job.returncode != 0, job.output[-4000:]
    report = the_report(tmp_path, "wait", job.output)
    assert report["not_arrived"] == [1], report
    assert report["ranks"]["1"]["state"] == "user code"
    assert "time.sleep(10_000)" in report["ranks"]["1"]["stack"]  # fetched across the link
    assert report["silent_nodes"] == []  # its node answered
    assert f"hpcddp: rank {report['rank']} of {len(cluster.nodes)} on {report['host']}: " \
        in job.stderr


@pytest.mark.parametrize("level", ["multiple", "serialized"])
def test_a_link_down_mid_training_with_no_pause_is_named(healthy, tmp_path, level):
    """Training with no pause, the second node's link goes down while the ranks compute
    and reduce: the watchdog, whose MPI calls wait for the main thread's to end
    (hpcddp/comm/serial.py), still asks, and names the node; no rank dies inside MPI
    (with two threads inside MPI at once, a rank on the healthy node used to die of
    SIGSEGV here at 'multiple')."""
    cluster = healthy
    victim = cluster.nodes[1]
    reports = tmp_path / "reports"
    proc = start_on_nodes(cluster, _train(cluster, tmp_path / "ckpt", steps=100_000),
                          ranks_per_node=2, nodes=cluster.nodes[:2],
                          env=dict(ENV, MPI4PY_RC_THREAD_LEVEL=level,
                                   HPCDDP_REPORT_DIR=str(reports)))
    seen = wait_for_line(proc, "step 40", timeout=180)
    _link_down(cluster, victim)
    faulted = time.monotonic()
    job = finish(proc, seen, timeout=LIMIT + 60)
    took = time.monotonic() - faulted
    assert not job.timed_out, f"the job hung:\n{job.output[-4000:]}"
    said = job.timeline[-4000:]
    assert job.returncode != 0 and took <= LIMIT, \
        f"rc {job.returncode}, {took:.0f} s; lines, seconds after the fault:\n{said}"
    report = the_report(reports, "wait", job.output)
    assert report["silent_nodes"] == [{"node": victim, "ranks": [2, 3]}], report
    assert "EXIT CODE: 11" not in job.output, job.output[-4000:]  # no rank died of SIGSEGV
