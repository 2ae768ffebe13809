"""Which other nodes a watchdog's report names, from the ranks' answers to its question:
those none of whose ranks answered (silent: the node, or its link, failed), and those
all of whose ranks answered late while waiting (slow: its link carries little).

A rank that waits answers within the watchdog's tick (its thread is idle beside the
wait), so an answer that takes a second or more crossed a link that barely carries
anything. Over a link shaped to 8 kbit/s, every rank can reach the collective and the
answers get through, slowly, while the collective's data never does: no rank is missing,
and without the answers' times the report could name nothing. Each answer holds
``answered_s``, the seconds from the question to its arrival. A node some of whose
answers are late and the rest not in yet is slow too.
"""

from typing import Dict, List

__all__ = ["SLOW_ANSWER_SECONDS", "silent_nodes", "slow_nodes"]

SLOW_ANSWER_SECONDS = 1.0


def _others(hosts: List[str], rank: int) -> Dict[str, List[int]]:
    found: Dict[str, List[int]] = {}
    for r, host in enumerate(hosts):
        if host != hosts[rank]:
            found.setdefault(host, []).append(r)
    return dict(sorted(found.items()))


def silent_nodes(hosts: List[str], rank: int, missing: List[int], replies: Dict[int, dict],
                 departed: Dict[int, dict]) -> List[dict]:
    """Each other node none of whose ranks answered (and none left): ``node``, ``ranks``."""
    return [{"node": host, "ranks": ranks} for host, ranks in _others(hosts, rank).items()
            if all(r in missing and r not in replies and r not in departed for r in ranks)]


def slow_nodes(hosts: List[str], rank: int, replies: Dict[int, dict],
               departed: Dict[int, dict] = None) -> List[dict]:
    """Each other node every rank of which answered while waiting, after
    ``SLOW_ANSWER_SECONDS`` or more, or has not answered yet (none having left), at least
    one having answered: ``node``, ``ranks``, ``seconds`` (the fastest of its answers),
    and ``unanswered`` where some have not. Answers that share one crawling link arrive
    one by one: the first of a node's may be in and the next still on its way."""
    found = []
    for host, ranks in _others(hosts, rank).items():
        answers = [replies[r] for r in ranks if r in replies]
        unanswered = [r for r in ranks if r not in replies]
        if not answers or any(r in (departed or {}) for r in unanswered):
            continue
        if all(a.get("waits") and a.get("answered_s", 0.0) >= SLOW_ANSWER_SECONDS
               for a in answers):
            node = {"node": host, "ranks": ranks,
                    "seconds": round(min(a["answered_s"] for a in answers), 1)}
            if unanswered:
                node["unanswered"] = unanswered
            found.append(node)
    return found
