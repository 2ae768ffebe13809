"""``hpcddp timeline``: draw a few training steps of a timeline, and say how much of the
gradient reduction hid behind backward.

Reads the Chrome trace that ``HPCDDP_TIMELINE`` wrote and draws one band per rank, with a
row per lane: compute (forward, backward, optimizer step), the DDP reducer (bucket
launches, waits, copies back), one row per bucket's reduction in MPI, and the loader's
waits. It prints, over every step after the first ``--skip``, the share of reduction time
that overlapped backward on the same rank. Needs matplotlib (``pip install matplotlib``).
"""

import json
import sys
from typing import Dict, List, Tuple

from hpcddp.cli import command_parser

__all__ = ["load_spans", "main", "overlap", "pyplot"]

_REDUCTION = "reduction (MPI)"  # how the trace names a bucket's lane (its thread_name)
_COLOURS = [("forward", "#4c72b0"), ("backward", "#dd8452"), ("launch", "#8172b3"),
            ("wait", "#c44e52"), ("copy back", "#937860"), ("loader", "#8c8c8c"),
            ("DDP bucket", "#55a868"), ("", "#64b5cd")]  # the rest: optimizer, torch ops

Span = Tuple[float, float, str]  # start and end in ms, name


def pyplot():
    """matplotlib's pyplot on the Agg backend, or SystemExit saying how to install it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("drawing needs matplotlib: pip install matplotlib (or the "
                         "extra: pip install 'hpcddp[timeline]')") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


Lane = Tuple[int, str]  # the trace's thread id and the name its metadata gives it


def load_spans(path) -> Dict[int, Dict[Lane, List[Span]]]:
    """``{rank: {(lane, lane name): [(start_ms, end_ms, name), ...]}}`` from a trace file;
    the lane names are those the trace itself records."""
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
    ranks: Dict[int, Dict[Lane, List[Span]]] = {}
    for e in events:
        if e.get("ph") == "X":
            start = e["ts"] / 1e3
            lane = (e["tid"], names.get((e["pid"], e["tid"]), f"lane {e['tid']}"))
            ranks.setdefault(e["pid"], {}).setdefault(lane, []).append(
                (start, start + e["dur"] / 1e3, e["name"]))
    for lanes in ranks.values():
        for spans in lanes.values():
            spans.sort()
    return ranks


def _backwards(lanes) -> List[Span]:
    return sorted(s for spans in lanes.values() for s in spans if s[2] == "backward")


def _reductions(lanes) -> List[Span]:
    return [s for (_, name), spans in lanes.items() if name.endswith(_REDUCTION) for s in spans]


def overlap(ranks, skip: int = 2) -> Tuple[float, float]:
    """(reduction ms, of which overlapping a backward on the same rank), summed over
    every rank and every step after the first ``skip`` of each rank."""
    total = hidden = 0.0
    for lanes in ranks.values():
        backwards = _backwards(lanes)
        if len(backwards) <= skip:
            continue
        since = backwards[skip][0]
        for start, end, _ in _reductions(lanes):
            if start < since:
                continue
            total += end - start
            hidden += sum(max(0.0, min(end, b_end) - max(start, b_start))
                          for b_start, b_end, _ in backwards)
    return total, hidden


def _window(ranks, first: int, steps: int) -> Tuple[float, float]:
    """From the forward before rank 0's backward ``first`` to the forward after backward
    ``first + steps - 1`` (or the trace's end)."""
    lanes = ranks[min(ranks)]
    backwards = _backwards(lanes)
    if not backwards:
        raise SystemExit("the trace holds no backward: was the model wrapped in "
                         "hpcddp.DistributedDataParallel, and did it train?")
    first = min(first, max(len(backwards) - steps, 0))
    last = min(first + steps, len(backwards)) - 1
    forwards = [s for spans in lanes.values() for s in spans if s[2] == "forward"]
    begin = max([f[0] for f in forwards if f[0] < backwards[first][0]],
                default=backwards[first][0])
    end = min([f[0] for f in forwards if f[0] > backwards[last][1]],
              default=max(s[1] for spans in lanes.values() for s in spans))
    return begin, end


def _colour(name: str) -> str:
    return next(c for prefix, c in _COLOURS if name.startswith(prefix))


def draw(ranks, out, first: int, steps: int) -> None:
    plt = pyplot()
    begin, end = _window(ranks, first, steps)
    rows = [(rank, lane) for rank in sorted(ranks) for lane in sorted(ranks[rank])
            if any(stop >= begin and start <= end for start, stop, _ in ranks[rank][lane])]
    fig, ax = plt.subplots(figsize=(12, 0.4 * len(rows) + 1.8))
    for y, (rank, lane) in enumerate(rows):
        for start, stop, name in ranks[rank][lane]:
            if stop >= begin and start <= end:
                ax.broken_barh([(start - begin, max(stop - start, 0.002))], (y - 0.4, 0.8),
                               color=_colour(name))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {r}: {name.split(' (')[0]}" for r, (_, name) in rows],
                       fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, end - begin)
    ax.set_xlabel("ms")
    total, hidden = overlap(ranks)
    share = f"{100 * hidden / total:.0f} % of reduction time overlaps backward" if total else ""
    ax.set_title(f"hpcddp timeline: {steps} steps from step {first}. {share}", fontsize=10)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, c in _COLOURS]
    ax.legend(handles, ["forward", "backward", "bucket launch", "wait", "copy back",
                        "loader wait", "bucket reduction (MPI)", "optimizer step, other"],
              fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv=None) -> int:
    parser = command_parser("timeline", __doc__)
    parser.add_argument("trace", help="the JSON file HPCDDP_TIMELINE wrote")
    parser.add_argument("-o", "--output", default="timeline.png", help="the PNG to write")
    parser.add_argument("--first", type=int, default=5, help="first step drawn (default 5)")
    parser.add_argument("--steps", type=int, default=3, help="steps drawn (default 3)")
    parser.add_argument("--skip", type=int, default=2,
                        help="steps left out of the overlap figure (warm-up; default 2)")
    args = parser.parse_args(argv)
    try:
        ranks = load_spans(args.trace)
    except (OSError, ValueError, KeyError) as error:
        print(f"hpcddp timeline: cannot read {args.trace} as a trace: {error}", file=sys.stderr)
        return 1
    if not ranks:
        print(f"hpcddp timeline: {args.trace} holds no spans", file=sys.stderr)
        return 1
    total, hidden = overlap(ranks, args.skip)
    for rank in sorted(ranks):
        count = len(_backwards(ranks[rank]))
        print(f"rank {rank}: {count} backward passes, "
              f"{len(_reductions(ranks[rank]))} bucket reductions")
    if total:
        print(f"bucket reductions: {total:.1f} ms in all, {hidden:.1f} ms "
              f"({100 * hidden / total:.0f} %) overlapping backward")
    draw(ranks, args.output, args.first, args.steps)
    print(f"wrote {args.output}")
    return 0
