"""hpcddp.faults.findings: what a watchdog's report finds, from answers written out here
as a rank's snapshot (``activity.snapshot()``) has them."""

from hpcddp.faults.findings import others_there, rank_state, uneven_ranks


def _answer(waits=(), channels=None, leaving=False, last=None, recent=None):
    return {"waits": list(waits), "channels": channels or {}, "leaving": leaving,
            "last": last, "stack": ["train.py:12"], "recent": recent or {}}


def _wait(call, channel, seq, seconds=3.0):
    return {"what": f"{call} on {channel}", "call": call, "channel": channel, "seq": seq,
            "seconds": seconds}


def test_each_state_a_missing_rank_can_be_in():
    replies = {1: _answer(leaving=True), 2: _answer([_wait("barrier", "world", 4)]),
               3: _answer(last=("allreduce", "DDP model", 7))}
    departed = {4: _answer()}
    states = {r: rank_state(r, replies, departed, f"node{r}", True, 5.0) for r in range(6)}
    assert states[0] == {"state": "silent", "node": "node0", "asked_s": 5.0}
    assert states[1] == {"state": "leaving"}
    assert states[2] == {"state": "waiting", "waits": [{"what": "barrier on world",
                                                        "seconds": 3.0}]}
    assert states[3] == {"state": "user code", "stack": ["train.py:12"],
                         "last": {"what": "allreduce", "channel": "DDP model", "seq": 7}}
    assert states[4] == {"state": "left"}
    assert rank_state(5, replies, departed, "node5", False, 5.0)["state"] == "not asked"


def test_uneven_inputs_are_ranks_stopped_at_another_step_not_slow_ones():
    mine = {"DDP model": (40, 10), "world": (3, 0)}
    replies = {1: _answer([_wait("barrier", "world", 3)], {"DDP model": (36, 9)}),
               2: _answer(channels={"DDP model": (36, 9)}),  # in user code: maybe slow
               3: _answer([_wait("allreduce", "DDP model", 40)], {"DDP model": (39, 10)})}
    departed = {4: _answer(channels={"DDP model": (32, 8), "world": (1, 0)})}
    found = uneven_ranks([1, 2, 3, 4, 5], replies, departed, mine)
    assert found == [
        {"rank": 1, "model": "DDP model", "step": 9, "this_step": 10, "state": "waits"},
        {"rank": 4, "model": "DDP model", "step": 8, "this_step": 10, "state": "ended"}]


def test_what_the_ranks_that_arrived_issued_there_where_it_differs():
    replies = {0: _answer([_wait("broadcast", "world", 5)]),
               1: _answer([_wait("allreduce", "world", 5)]),
               2: _answer(recent={"world": [(4, "allreduce"), (5, "allgather")]}),
               3: _answer(recent={"world": [(5, "allreduce")]})}
    assert others_there("world", 5, "allreduce", replies) == [
        {"rank": 0, "call": "broadcast", "state": "waits"},
        {"rank": 2, "call": "allgather", "state": "completed"}]
    assert others_there(None, 5, "allreduce", replies) == []
