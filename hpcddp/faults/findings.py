"""What a watchdog's report finds about a wait that cannot complete, as data, from the
other ranks' answers to its question (``activity.snapshot()`` of each) and the notes of
the ranks that have left: what each rank that has not arrived is doing
(``rank_state``), the ranks that stopped at another DDP step (``uneven_ranks``: uneven
inputs), and what the ranks that did arrive issued there instead (``others_there``: an
MPI may match one rank's broadcast with another's allreduce).

Pure functions of those answers; ``hpcddp.faults.report`` says the result in words.
"""

from typing import Dict, List, Optional

__all__ = ["others_there", "rank_state", "uneven_ranks"]


def rank_state(rank: int, replies: Dict[int, dict], departed: Dict[int, dict],
               host: str, asked: bool, asked_s: float) -> dict:
    """What ``rank``, which has not arrived, is doing: left, silent (``asked``, no
    answer within ``asked_s`` seconds) or not asked, leaving, waiting (in what, for how
    long), or in user code (its stack and its last collective)."""
    if rank in departed:
        return {"state": "left"}
    reply = replies.get(rank)
    if reply is None:
        return {"state": "silent" if asked else "not asked", "node": host, "asked_s": asked_s}
    if reply["leaving"]:
        return {"state": "leaving"}
    if reply["waits"]:
        return {"state": "waiting", "waits": [{"what": w["what"], "seconds": w["seconds"]}
                                              for w in reply["waits"]]}
    last = reply["last"]
    return {"state": "user code", "stack": reply["stack"],
            "last": {"what": last[0], "channel": last[1], "seq": last[2]} if last else None}


def uneven_ranks(missing: List[int], replies: Dict[int, dict], departed: Dict[int, dict],
                 mine: Dict[str, tuple]) -> List[dict]:
    """Uneven inputs: the ranks of ``missing`` that stopped (left, or wait elsewhere) at
    another step of a DDP model than this rank's (``mine``: this rank's channels, name
    to (collectives, steps)). A rank in user code may just be slow, so it proves
    nothing.

    >>> uneven_ranks([1], {}, {1: {"channels": {"DDP model": (9, 3)}}},
    ...              {"DDP model": (12, 4)})
    [{'rank': 1, 'model': 'DDP model', 'step': 3, 'this_step': 4, 'state': 'ended'}]
    """
    found = []
    for rank in missing:
        note = departed.get(rank) or replies.get(rank)
        if note is None or (rank not in departed and not note["waits"]):
            continue
        for name, (_, step) in mine.items():
            theirs = note["channels"].get(name)
            if name.startswith("DDP") and theirs is not None and theirs[1] != step:
                found.append({"rank": rank, "model": name, "step": theirs[1],
                              "this_step": step,
                              "state": "ended" if rank in departed else "waits"})
    return found


def others_there(channel: Optional[str], seq: int, call: str,
                 replies: Dict[int, dict]) -> List[dict]:
    """What the ranks that reached collective ``seq`` of ``channel`` issued there, where
    it differs from ``call``: what they wait in, or what they completed and went past."""
    if channel is None:
        return []
    found = []
    for rank, reply in sorted(replies.items()):
        there = [("waits", w["call"]) for w in reply["waits"]
                 if (w["channel"], w["seq"]) == (channel, seq)]
        there = there or [("completed", done) for number, done
                          in reply.get("recent", {}).get(channel, ()) if number == seq]
        found += [{"rank": rank, "call": done, "state": state}
                  for state, done in there if done != call]
    return found
