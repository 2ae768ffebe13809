"""What a rank that ends the job says, as data beside the text it prints.

A rank that aborts the job prints its reason to stderr for a person. Where
``HPCDDP_REPORT_DIR`` names a folder it also writes the same facts as JSON, one file
per reporting rank, ``hpcddp-report-rank<N>.json``, for a program: a batch script that
decides whether to requeue and which node to leave out, a scheduler's epilogue, a
dashboard. The fields:

- ``rank``, ``size``, ``host``, ``message`` (the headline), ``code`` (the exit status);
- ``kind``: ``exception`` (uncaught, with ``thread`` where not the main one),
  ``process_failed`` (an MPI error where the MPI knows ranks died, ULFM's
  ``hpcddp.faults.failed``: ``failed_ranks``, and ``failed_nodes`` with ``node`` and
  ``ranks``),
  ``interrupted`` (Ctrl-C), ``wait`` (the watchdog: a wait that cannot complete),
  ``startup`` (ranks missing at ``init()``), ``test`` (a failed test under
  ``hpcddp.testing``);
- ``exception``: ``{"type", "message"}`` where an exception ended the rank;
- for ``wait``: ``wait`` (``what``, ``call``, ``channel``, ``seq``), ``reason``
  (``departed``: a rank left before reaching it; ``timeout``: ``HPCDDP_TIMEOUT`` ran
  out), ``setting`` and ``seconds`` for a timeout, ``not_arrived`` (ranks), ``ranks``
  (what each rank that has not arrived is doing: ``state`` is ``left``, ``silent``,
  ``not asked``, ``leaving``, ``waiting`` with its ``waits``, or ``user code`` with the
  ``last`` collective it entered and its ``stack``), ``silent_nodes`` (``node``,
  ``ranks``: a node none of whose ranks answered), ``slow_nodes`` (``node``, ``ranks``,
  ``seconds``: a node all of whose ranks answered late while waiting, its link carrying
  almost nothing; ``hpcddp.faults.suspects``), ``different_collectives`` (``rank``,
  ``call``, ``state``: ``waits``, or ``completed`` where the MPI matched the two),
  ``uneven`` (``rank``, ``model``, ``step``, ``this_step``, ``state``) and ``fix`` (what
  to change, where hpcddp knows).

Writing is best effort and never delays the abort by more than the write itself: a
folder that cannot be made or written leaves only the text. Standard library only.
"""

import json
import os
import socket
from typing import List, Optional

from hpcddp.comm.ranks import ranks_text

__all__ = ["REPORT_NAME", "describe_rank", "different_said", "indent", "ranks_said",
           "report_path", "wait_report_text", "write_report"]

REPORT_NAME = "hpcddp-report-rank{rank}.json"


def report_path(rank: int, environ=None) -> Optional[str]:
    """Where ``rank`` writes its report, or None where ``HPCDDP_REPORT_DIR`` is unset
    (or unreadable: the abort that reads it must not fail on it)."""
    from hpcddp.env import get_setting

    try:
        folder = get_setting("REPORT_DIR", environ)
    except ValueError:
        return None
    return os.path.join(folder, REPORT_NAME.format(rank=rank)) if folder else None


def write_report(rank: int, size: int, message: str, code: int, exc_info=None,
                 facts: Optional[dict] = None) -> Optional[str]:
    """Write this rank's report where ``HPCDDP_REPORT_DIR`` says; return its path, or
    None where none was written. Published whole: written beside, then renamed."""
    path = report_path(rank)
    if path is None:
        return None
    report = {"rank": rank, "size": size, "host": socket.gethostname(), "message": message,
              "code": code}
    if exc_info and exc_info[0] is not None:
        report["exception"] = {"type": exc_info[0].__name__, "message": str(exc_info[1])}
    report.update(facts or {})
    report.setdefault("kind", "exception" if "exception" in report else "abort")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.partial"
        with open(partial, "w") as out:
            json.dump(report, out, indent=1, default=str)
        os.replace(partial, path)
    except OSError:
        return None
    return path


# -- the watchdog's report in words, from its fields --------------------------------------

def ranks_said(ranks) -> str:
    """``rank 1`` or ``ranks 0,2``."""
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ranks_text(ranks)


def describe_rank(rank: int, state: dict, several_nodes: bool, stack: bool) -> str:
    """What ``rank`` (one that has not arrived) is doing, from its ``state`` field."""
    kind = state["state"]
    if kind == "left":
        return f"rank {rank} has left the job (its script ended, or called sys.exit)"
    if kind == "silent":
        where = f" on {state['node']}" if several_nodes else ""
        return (f"rank {rank}{where} did not answer within {state['asked_s']:g} s (it died, or "
                f"holds Python's GIL in a long C call)")
    if kind == "not asked":
        return f"rank {rank}: not asked (MPI thread level below 'serialized')"
    if kind == "leaving":
        return f"rank {rank} is leaving the job (hpcddp.shutdown() or the end of its script)"
    if kind == "waiting":
        return f"rank {rank} waits in " + "; and in ".join(
            f"{w['what']} for {w['seconds']:g} s" for w in state["waits"])
    last = state["last"]
    text = f"rank {rank} is in user code" + (
        f" (the last hpcddp collective it entered: {last['what']}, collective {last['seq']} "
        f"on {last['channel']})" if last else " (it has entered no hpcddp collective yet)")
    if stack:
        text += "; its main thread is at:\n" + indent(state["stack"])
    return text


def different_said(different) -> List[str]:
    return [f"rank {d['rank']} {'completed' if d.get('state') == 'completed' else 'waits in'} "
            f"{d['call']}" for d in different]


def _not_at_all(node: dict) -> str:
    """`` (rank 3 not at all)``: the ranks of a slow node whose answers are not in yet."""
    unanswered = node.get("unanswered")
    return f" ({ranks_said(unanswered)} not at all)" if unanswered else ""


def wait_report_text(fields: dict, reason: str, several_nodes: bool) -> str:
    """The watchdog's report of a wait that cannot complete, from its fields."""
    wait, missing = fields["wait"], fields["not_arrived"]
    lines = [f"it waits in {wait['what']}: {reason}."]
    if missing:
        lines.append(f"Not arrived: {ranks_said(missing)}.")
        lines += [f"No rank on node {n['node']} ({ranks_said(n['ranks'])}) answered: that node, "
                  f"or its network link, has failed." for n in fields["silent_nodes"]]
        lines += [describe_rank(r, fields["ranks"][str(r)], several_nodes, stack=True)
                  for r in missing]
    elif (fields["wait"].get("channel") and fields.get("reason") == "timeout"
          and not fields["different_collectives"]):
        lines.append("Every rank has reached this collective, and its data does not move "
                     "between them.")
    lines += [f"Node {n['node']} ({ranks_said(n['ranks'])}) answered only after "
              f"{n['seconds']:g} s{_not_at_all(n)}, waiting like this rank: that node's "
              f"network link carries almost nothing." for n in fields.get("slow_nodes") or ()]
    if fields["different_collectives"]:
        lines.append(f"This rank waits in {wait['call']} as collective {wait['seq']}, but "
                     + "; ".join(different_said(fields["different_collectives"]))
                     + ": the ranks issued different collectives "
                     "(HPCDDP_DEBUG=detail names the first difference as it happens).")
    lines.append(f"This rank's main thread is at:\n{indent(fields['stack'])}")
    text = "\n".join(lines)
    if fields["uneven"]:
        said = "; ".join(f"rank {u['rank']} {u['state']} at step {u['step']} of {u['model']} "
                         f"where this rank is at step {u['this_step']}" for u in fields["uneven"])
        text += (f"\nUneven inputs: {said}. The ranks had different numbers of batches. Give "
                 f"every rank the same number (DistributedSampler pads, drop_last=True "
                 f"drops), or wrap the training loop in `with model.join():`.")
    return text + "\n"


def indent(text: str) -> str:
    return "".join("    " + line for line in text.splitlines(True))
