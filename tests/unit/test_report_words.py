"""An ending rank's report: its JSON file (HPCDDP_REPORT_DIR) and, once per message, the
words said from its fields. The job tests (tests/jobs/test_hangs.py, test_jobs.py) assert
what real failures report through the same fields."""

import json
import sys

import pytest

from hpcddp.faults.report import describe_rank, wait_report_text, write_report

WAIT = {"what": "allreduce (sum) of 3 float32 (12 B)", "call": "allreduce (sum) of float32[3]",
        "channel": "torch.distributed", "seq": 7}


def _fields(**changes):
    fields = {"wait": WAIT, "not_arrived": [], "ranks": {}, "silent_nodes": [],
              "different_collectives": [], "uneven": [], "stack": "  File \"train.py\", "
              "line 3, in <module>\n"}
    fields.update(changes)
    return fields


def test_a_rank_in_user_code_is_said_with_its_last_collective_and_stack():
    state = {"state": "user code", "stack": "  File \"train.py\", line 9\n    time.sleep(1)\n",
             "last": {"what": "broadcast", "channel": "DDP model #0", "seq": 4}}
    text = wait_report_text(_fields(not_arrived=[1], ranks={"1": state}),
                            "no progress for 4 s (HPCDDP_TIMEOUT=4)", several_nodes=False)
    assert text.startswith("it waits in allreduce (sum) of 3 float32 (12 B): no progress for "
                           "4 s (HPCDDP_TIMEOUT=4).\nNot arrived: rank 1.\n")
    assert ("rank 1 is in user code (the last hpcddp collective it entered: broadcast, "
            "collective 4 on DDP model #0); its main thread is at:\n"
            "      File \"train.py\", line 9\n        time.sleep(1)\n") in text
    assert text.endswith("This rank's main thread is at:\n      File \"train.py\", line 3, "
                         "in <module>\n\n")


@pytest.mark.parametrize("state, words", [
    ({"state": "left"}, "rank 2 has left the job (its script ended, or called sys.exit)"),
    ({"state": "silent", "node": "n2", "asked_s": 5.0},
     "rank 2 on n2 did not answer within 5 s (it died, or holds Python's GIL in a long C call)"),
    ({"state": "not asked", "node": "n2"},
     "rank 2: not asked (MPI thread level below 'serialized')"),
    ({"state": "leaving"},
     "rank 2 is leaving the job (hpcddp.shutdown() or the end of its script)"),
    ({"state": "waiting", "waits": [{"what": "barrier", "seconds": 3.5},
                                    {"what": "allreduce", "seconds": 1.0}]},
     "rank 2 waits in barrier for 3.5 s; and in allreduce for 1 s"),
    ({"state": "user code", "stack": "", "last": None},
     "rank 2 is in user code (it has entered no hpcddp collective yet)"),
])
def test_each_state_of_a_missing_rank_in_words(state, words):
    assert describe_rank(2, state, several_nodes=True, stack=False) == words


def test_a_node_none_of_whose_ranks_answered_is_named():
    silent = {"state": "silent", "node": "n2", "asked_s": 5.0}
    text = wait_report_text(_fields(not_arrived=[2, 3], ranks={"2": silent, "3": silent},
                                    silent_nodes=[{"node": "n2", "ranks": [2, 3]}]),
                            "no progress for 10 s (HPCDDP_TIMEOUT=10)", several_nodes=True)
    assert ("Not arrived: ranks 2,3.\nNo rank on node n2 (ranks 2,3) answered: that node, or "
            "its network link, has failed.\n") in text


def test_different_collectives_and_uneven_inputs_in_words():
    text = wait_report_text(_fields(
        different_collectives=[{"rank": 1, "call": "broadcast from rank 0 of float32[3]"}],
        uneven=[{"rank": 0, "model": "DDP model #0", "step": 4, "this_step": 5,
                 "state": "ended"}]), "rank 0 left the job before reaching it, so it can "
        "never complete", several_nodes=False)
    assert ("This rank waits in allreduce (sum) of float32[3] as collective 7, but rank 1 "
            "waits in broadcast from rank 0 of float32[3]: the ranks issued different "
            "collectives (HPCDDP_DEBUG=detail names the first difference as it happens).") in text
    assert text.endswith("\nUneven inputs: rank 0 ended at step 4 of DDP model #0 where this "
                         "rank is at step 5. The ranks had different numbers of batches. Give "
                         "every rank the same number (DistributedSampler pads, drop_last=True "
                         "drops), or wrap the training loop in `with model.join():`.\n")


def test_a_different_collective_the_mpi_completed_in_words():
    # An MPI may complete one rank's broadcast with another's allreduce (Intel MPI 2021
    # does): the rank that went past it is named with what it issued there.
    text = wait_report_text(_fields(different_collectives=[
        {"rank": 1, "call": "broadcast from rank 0 of float32[3]", "state": "completed"}]),
        "no progress for 4 s (HPCDDP_TIMEOUT=4)", several_nodes=False)
    assert ("This rank waits in allreduce (sum) of float32[3] as collective 7, but rank 1 "
            "completed broadcast from rank 0 of float32[3]: the ranks issued different "
            "collectives") in text


def test_no_report_file_unless_asked(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCDDP_REPORT_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert write_report(0, 2, "ended", 1) is None
    assert list(tmp_path.iterdir()) == []


def test_the_report_file_holds_the_fields_and_the_exception(tmp_path, monkeypatch):
    folder = tmp_path / "made" / "here"
    monkeypatch.setenv("HPCDDP_REPORT_DIR", str(folder))
    try:
        raise KeyError("batch 7")
    except KeyError:
        path = write_report(3, 4, "uncaught exception", 1, sys.exc_info(),
                            facts={"kind": "exception", "thread": "loader"})
    assert path == str(folder / "hpcddp-report-rank3.json")
    report = json.loads((folder / "hpcddp-report-rank3.json").read_text())
    assert {k: report[k] for k in ("rank", "size", "message", "code", "kind", "thread")} == \
        {"rank": 3, "size": 4, "message": "uncaught exception", "code": 1,
         "kind": "exception", "thread": "loader"}
    assert report["exception"] == {"type": "KeyError", "message": "'batch 7'"}
    assert [p.name for p in folder.iterdir()] == ["hpcddp-report-rank3.json"]  # no partial


def test_a_folder_that_cannot_be_written_leaves_the_text_alone(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("HPCDDP_REPORT_DIR", str(blocker / "reports"))
    assert write_report(0, 2, "ended", 1, facts={"kind": "wait"}) is None
