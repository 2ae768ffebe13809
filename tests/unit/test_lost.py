"""``hpcddp lost``: the node a failed job lost, from the launchers' words and the
watchdog's reports. The launchers' lines are as each MPI prints them (the same words the
cross-node fault tests find in real jobs, tests/cluster/test_faults.py, which also run
this command on what each real fault left)."""

import json
import subprocess
import sys

import pytest

from hpcddp.commands.lost import LOST_EXIT, from_launcher, from_reports

DEATHS = {
    "srun": "srun: error: n2: task 3: Killed\nsrun: Terminating StepId=7.0\n"
            "srun: error: n1: tasks 0-1: Killed\n",
    "mpich hydra": "=================\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n"
                   "=   PID 4242 RUNNING AT n2\n=   EXIT CODE: 9\n=   CLEANING UP\n",
    "intel hydra": "=   RANK 2 PID 33 RUNNING AT n2\n=   KILLED BY SIGNAL: 9 (Killed)\n",
    "open mpi": "prterun noticed that process rank 2 with PID 0 on node n2 exited on\n"
                "signal 9 (Killed).\n",
    "prterun": "PRTE has lost communication with a remote daemon.\n\n"
               "  HNP daemon   : [prterun-n1-1@0,0] on node n1\n"
               "  Remote daemon: [prterun-n1-1@0,1] on node n2\n",
    "srun, a segfault": "srun: error: n2: task 2: Segmentation fault (core dumped)\n",
    "prterun, a daemon gone": (
        "A daemon failed to report back after being spawned. This could\nbe due to several "
        "factors, including inability to find the\ndaemon executable, or the executable was "
        "unable to find its\nrequired supporting libraries. In some cases, the daemon was\n"
        "able to execute, but was unable to complete a TCP connection\nback to prterun:\n\n"
        "  Local host:    n1\n  Remote host:   n2\n  Daemon exit status: 137\n"),
}
# A rank that exits (hpcddp's abort, a Python error) blames no node, though the launcher
# then kills the others and says so.
EXITS = {
    "intel hydra after hpcddp's abort": (
        "hpcddp: rank 0 of 4 on n1: a wait cannot complete; aborting all ranks\n"
        "[rank 0] No rank on node n2 (ranks 2,3) answered\n"
        "Abort(1) on node 0 (rank 0 in comm 480): application called MPI_Abort(hpcddp."
        "watchdog, 1) - process 0\n=====\n=   BAD TERMINATION OF ONE OF YOUR APPLICATION "
        "PROCESSES\n=   RANK 1 PID 15524 RUNNING AT n1\n=   KILLED BY SIGNAL: 9 (Killed)\n"),
    "srun": "srun: error: n1: task 0: Exited with exit code 1\nsrun: error: n2: tasks 2-3: "
            "Killed\n",
    "mpich hydra": "=   PID 4242 RUNNING AT n1\n=   EXIT CODE: 1\n",
    "nothing": "epoch 3: loss 0.2\n",
}


@pytest.mark.parametrize("launcher", DEATHS)
def test_the_first_death_names_its_node(launcher):
    found = from_launcher(DEATHS[launcher])
    assert found["node"] == "n2", found
    assert found["why"].startswith("the launcher: ")


@pytest.mark.parametrize("launcher", EXITS)
def test_an_exit_names_no_node(launcher):
    assert from_launcher(EXITS[launcher]) is None


def _wait(rank, host, silent):
    return {"kind": "wait", "rank": rank, "host": host,
            "silent_nodes": [{"node": node, "ranks": []} for node in silent]}


def test_both_sides_of_a_link_blame_each_other_and_rank_zeros_side_decides():
    found = from_reports([_wait(3, "n2", ["n1"]), _wait(1, "n1", ["n2"]),
                          _wait(0, "n1", ["n2"])])
    assert found["node"] == "n2" and "on n1" in found["why"]


def test_on_three_nodes_the_node_most_others_find_silent_is_lost():
    # n2's link is down: n1 and n3 find n2 silent, n2 finds both of them silent.
    found = from_reports([_wait(2, "n2", ["n1", "n3"]), _wait(0, "n1", ["n2"]),
                          _wait(4, "n3", ["n2"])])
    assert found["node"] == "n2" and "n1, n3" in found["why"]


def test_reports_that_name_no_silent_node_name_none():
    assert from_reports([{"kind": "exception", "rank": 0, "host": "n1"},
                         _wait(0, "n1", [])]) is None


def _lost(*args):
    return subprocess.run([sys.executable, "-m", "hpcddp", "lost", *args],
                          capture_output=True, text=True, timeout=60)


def test_the_watchdogs_verdict_comes_before_what_the_launcher_did_after_it(tmp_path):
    """Intel MPI's hydra, after hpcddp's watchdog aborted the job over a silent node, says
    it killed a rank on the healthy node: the reports name the silent one."""
    (tmp_path / "hpcddp-report-rank0.json").write_text(json.dumps(_wait(0, "n1", ["n2"])))
    log = tmp_path / "job.out"
    log.write_text(EXITS["intel hydra after hpcddp's abort"].replace("=====", "srun: error: n1: tasks 0-1: Killed\n"))
    done = _lost("--reports", str(tmp_path), "--log", str(log))
    assert (done.returncode, done.stdout) == (0, "n2\n"), done.stderr


def test_the_command_prints_the_node_or_exits_3(tmp_path):
    (tmp_path / "hpcddp-report-rank0.json").write_text(json.dumps(_wait(0, "n1", ["n2"])))
    (tmp_path / "hpcddp-report-rank3.json").write_text("{half a rep")  # killed mid-write
    log = tmp_path / "job.out"
    log.write_text(EXITS["mpich hydra"])
    done = _lost("--reports", str(tmp_path), "--log", str(log))
    assert (done.returncode, done.stdout) == (0, "n2\n"), done.stderr
    assert "hpcddp lost: n2: every rank on it silent" in done.stderr
    log.write_text(DEATHS["srun"])
    done = _lost("--log", str(log), "--json")
    assert json.loads(done.stdout)[0]["node"] == "n2"
    log.write_text(EXITS["nothing"])
    done = _lost("--log", str(log))
    assert done.returncode == LOST_EXIT and done.stdout == ""
    assert "no node named" in done.stderr
    assert _lost().returncode == 2


def test_a_node_slow_to_answer_is_lost_and_said_so():
    report = {"kind": "wait", "rank": 0, "host": "n1", "silent_nodes": [],
              "slow_nodes": [{"node": "n3", "ranks": [2], "seconds": 2.9}]}
    assert from_reports(iter([report])) == \
        {"node": "n3", "why": "every rank on it slow to answer to hpcddp's watchdog on n1"}


def _dead(rank, host, dead):
    """A survivor's report under ULFM: MPI told it ``dead`` ({node: ranks}) died."""
    return {"kind": "process_failed", "rank": rank, "host": host,
            "failed_ranks": sorted(r for ranks in dead.values() for r in ranks),
            "failed_nodes": [{"node": n, "ranks": r} for n, r in dead.items()]}


def test_ranks_mpi_reports_dead_name_their_node(tmp_path):
    """Under Open MPI's ULFM the survivors' reports name the dead ranks' node, before
    the launcher's line about a healthy rank it ended after hpcddp's abort (the reports
    are real ones: tests/jobs/test_hangs.py writes them)."""
    reports = [_dead(0, "n1", {"n2": [2, 3]}), _dead(1, "n1", {"n2": [2, 3]})]
    assert from_reports(reports) == \
        {"node": "n2", "why": "ranks 2,3 on it dead, as MPI told ranks on n1"}
    for report in reports:
        (tmp_path / f"hpcddp-report-rank{report['rank']}.json").write_text(json.dumps(report))
    log = tmp_path / "job.out"
    log.write_text("hpcddp: rank 0 of 4 on n1: MPI reports ranks 2,3 on node n2 dead "
                   "(MPI_ERR_PROC_FAILED: Process Failure); aborting all ranks\n"
                   "prterun noticed that process rank 1 with PID 9 on node n1 exited on\n"
                   "signal 9 (Killed).\n")
    done = _lost("--reports", str(tmp_path), "--log", str(log))
    assert (done.returncode, done.stdout) == (0, "n2\n"), done.stderr
    # A rank that knows of no dead peer writes no process_failed report: an exception
    # names no node, whatever the launcher says after hpcddp's abort.
    assert from_reports([{"kind": "exception", "rank": 0, "host": "n1"}]) is None
    # Rank 0 ended the job itself (the watchdog's verdict on a rank stuck in user code):
    # to MPI it is dead too, and a survivor may say so before the launcher ends it. Its
    # own report shows it was alive: no node is lost.
    stuck = {"kind": "wait", "rank": 0, "host": "n1", "silent_nodes": [], "slow_nodes": []}
    assert from_reports([stuck, _dead(2, "n2", {"n1": [0]})]) is None

