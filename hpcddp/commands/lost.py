"""``hpcddp lost``: which node a failed job lost, for a batch script that restarts
without it.

After a training step fails, it reads what the job left: the ranks' JSON reports
(``HPCDDP_REPORT_DIR``, ``hpcddp.faults.report``) and the launcher's output (the job's log),
and prints the nodes to leave out, one line, comma-separated, as ``srun --exclude`` and
``scontrol update ExcNodeList=`` take them. A node counts as lost where

- the launcher saw a process on it die of a signal (the ranks killed, a GPU fault, the
  out-of-memory killer): srun's ``srun: error: NODE: task N: Killed``, MPICH's and Intel
  MPI's hydra ``RUNNING AT NODE ... EXIT CODE: 9`` / ``KILLED BY SIGNAL``, Open MPI's
  ``on node NODE exited on signal N``, or its launcher losing the node's daemon
  (``Remote daemon: ... on node NODE``, ``Remote host: NODE``). The
  first such line names the node: the launcher kills the other ranks after it, and
  says so in later lines;
- hpcddp's watchdog found every rank on it silent (its ranks alive behind a link
  that no longer carries them), or slow to answer while they wait (a link that carries
  almost nothing): the ``silent_nodes`` and ``slow_nodes`` of the ``wait`` reports.
  Both sides of a failed link see the other silent, so each report is one vote and a
  node is lost where the reports of more nodes name it than name any other; between two
  nodes the side of rank 0 (where the launcher's output is) decides;
- under an MPI with process fault tolerance (ULFM, as Open MPI's
  ``mpirun --with-ft ulfm``), MPI told the other ranks that its ranks died: the
  ``failed_nodes`` of the ``process_failed`` reports, which vote likewise.

The watchdog's verdict comes first: after its abort the launcher ends healthy ranks and
may say it killed them, so only what the launcher said before any abort of hpcddp's
counts. A rank that ended with an exception, or a failed test, names no node: that is a
bug to fix, not a node to leave out, and a restart would meet it again.

Exit status: 0 with the nodes printed, 3 where nothing names a node (the script should
not restart then), 2 for a usage error.

Example (in a batch script)::

    lost=$(hpcddp lost --reports "$HPCDDP_REPORT_DIR" --log "$LOG") || exit 1
    srun --exclude="$lost" ...
"""

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from hpcddp.commands.parser import command_parser
from hpcddp.faults.report import ranks_said

__all__ = ["LOST_EXIT", "from_launcher", "from_reports", "lost_nodes", "main"]

LOST_EXIT = 3  # nothing names a node

_NODE = r"([A-Za-z0-9][\w.\-]*)"
_SIGNALLED = r"(?:Killed|Terminated|Segmentation fault|Aborted|Bus error)"
# What each launcher prints when a process on a node ends badly, and whether that end
# was a death (a signal, a node's daemon gone) or an exit (hpcddp's own abort, a crash
# in Python: no node to blame). Only the earliest line counts: the launcher kills the
# other ranks after it and says so in later lines.
_LAUNCHER_LINES = [
    # srun: "srun: error: n2: task 2: Killed", "... tasks 0-1: Exited with exit code 1"
    re.compile(rf"^srun: error: {_NODE}: tasks? [\d,\-]+: (?P<death>{_SIGNALLED})?.*$", re.M),
    # MPICH's and Intel MPI's hydra: "=   PID 123 RUNNING AT n2" then "=   EXIT CODE: 9"
    # (MPICH: the signal's number) or "=   KILLED BY SIGNAL: 9 (Killed)" (Intel MPI).
    re.compile(rf"RUNNING AT {_NODE}[ \t]*\n=\s+(?:(?P<death>EXIT CODE: (?:6|7|9|11)\b"
               rf"|KILLED BY SIGNAL: .*)|EXIT CODE: .*)"),
    # Open MPI: "... rank 2 with PID 123 on node n2 exited on signal 9 (Killed)."
    re.compile(rf"on node {_NODE} (?P<death>exited on\s+signal \d+.*)"),
    # Open MPI's prterun, its daemon on the node gone: "Remote daemon: [...] on node n2",
    # or "A daemon failed to report back ..." then "  Remote host:   n2".
    re.compile(rf"(?P<death>Remote daemon:[^\n]* on node) {_NODE}"),
    re.compile(rf"(?P<death>A daemon failed to report back)[\s\S]{{0,600}}?"
               rf"Remote host:[ \t]+{_NODE}"),
]


# hpcddp's own abort (the watchdog's verdict, an exception): what the launcher says after
# it is the launcher ending the other ranks, which blames no node.
_HPCDDP_ABORT = re.compile(r"hpcddp: rank \d+ of \d+ on \S+: [^\n]*aborting all ranks")


def from_launcher(text: str) -> Optional[Dict[str, str]]:
    """The node of the first process death the launcher reports in ``text`` before any
    abort of hpcddp's, with its words; None where it reports none, or where its first
    report is an exit."""
    cut = _HPCDDP_ABORT.search(text)
    if cut:
        text = text[:cut.start()]
    first = None
    for pattern in _LAUNCHER_LINES:
        match = pattern.search(text)
        if match and (first is None or match.start() < first.start()):
            first = match
    if first is None or first.group("death") is None:
        return None
    node = next(g for i, g in enumerate(first.groups(), 1)
                if g is not None and first.re.groupindex.get("death") != i)
    return {"node": node, "why": "the launcher: " + " ".join(first.group(0).split())}


def _reports(folder) -> List[dict]:
    found = []
    for path in sorted(Path(folder).glob("hpcddp-report-rank*.json")):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # half a report (its rank was killed while writing) says nothing
    return found


def _named_nodes(report: dict, alive: set) -> set:
    """The nodes one report blames: a ``wait`` report's silent and slow nodes, a
    ``process_failed`` report's nodes of ranks MPI knows to be dead, but for a node whose
    dead ranks include one that wrote a report (``alive``): that rank ended the job
    itself (its abort is a death to MPI), and its report says why."""
    if report.get("kind") == "process_failed":
        return {n["node"] for n in report.get("failed_nodes") or []
                if not alive.intersection(n["ranks"])}
    return {n["node"] for n in (report.get("silent_nodes") or [])
            + (report.get("slow_nodes") or [])}


def from_reports(reports: Iterable[dict]) -> Optional[Dict[str, str]]:
    """The node the watchdog's ``wait`` reports find silent, or MPI's ``process_failed``
    reports dead (ULFM, ``hpcddp.faults.failed``), by the reporting nodes' votes (see the
    module's text); None where no report names one."""
    votes: Counter = Counter()
    home_said = None
    reports = list(reports)
    alive = {r.get("rank") for r in reports}
    reports = [r for r in reports if r.get("kind") in ("wait", "process_failed")]
    for report in sorted(reports, key=lambda r: r.get("rank", 0)):
        named = _named_nodes(report, alive)
        for node in named:
            votes[(report.get("host"), node)] = 1
        if home_said is None and named:
            home_said = sorted(named)
    by_node = Counter(node for _, node in votes)
    if not by_node:
        return None
    ranked = by_node.most_common()
    top = [node for node, count in ranked if count == ranked[0][1]]
    node = top[0] if len(top) == 1 else next((n for n in home_said or [] if n in top), top[0])
    reporters = ", ".join(sorted({host for host, n in votes if n == node}))
    dead = sorted({r for report in reports if report.get("kind") == "process_failed"
                   for n in report.get("failed_nodes") or [] if n["node"] == node
                   and not alive.intersection(n["ranks"]) for r in n["ranks"]})
    if dead:
        return {"node": node, "why": f"{ranks_said(dead)} on it dead, as MPI told ranks on "
                                     f"{reporters}"}
    slow = any(n["node"] == node for report in reports for n in report.get("slow_nodes") or [])
    return {"node": node, "why": f"every rank on it {'slow to answer' if slow else 'silent'} "
                                 f"to hpcddp's watchdog on {reporters}"}


def lost_nodes(reports_folder=None, log_text: str = "") -> List[Dict[str, str]]:
    """The nodes to leave out, each with why: the watchdog's silent node, else the
    launcher's first death (a dead node's ranks are silent too, so the two agree where
    both speak; after the watchdog's abort the launcher kills healthy ranks)."""
    seen = from_reports(_reports(reports_folder)) if reports_folder is not None else None
    if seen is None and log_text:
        seen = from_launcher(log_text)
    return [seen] if seen else []


def main(argv=None) -> int:
    parser = command_parser("lost", __doc__)
    parser.add_argument("--reports", metavar="DIR",
                        help="the job's HPCDDP_REPORT_DIR (the ranks' JSON reports)")
    parser.add_argument("--log", metavar="FILE",
                        help="the job's output, where the launcher reports dead processes")
    parser.add_argument("--json", action="store_true",
                        help="print the nodes and why as JSON instead")
    args = parser.parse_args(argv)
    if args.reports is None and args.log is None:
        parser.error("give --reports DIR, --log FILE or both")
    text = ""
    if args.log is not None:
        try:
            text = Path(args.log).read_text(errors="replace")
        except OSError as exc:
            parser.error(f"--log {args.log}: {exc.strerror}")
    found = lost_nodes(args.reports, text)
    if args.json:
        print(json.dumps(found))
    elif found:
        print(",".join(item["node"] for item in found))
    for item in found:
        print(f"hpcddp lost: {item['node']}: {item['why']}", file=sys.stderr)
    if not found:
        print("hpcddp lost: no node named: no process died of a signal and no node was "
              "silent (a failure in the program itself, which a restart would meet again)",
              file=sys.stderr)
    return 0 if found else LOST_EXIT


if __name__ == "__main__":
    sys.exit(main())
