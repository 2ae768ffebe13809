"""Read an ``HPCDDP_TIMELINE`` trace, measure how much gradient reduction hid behind
backward, and draw a few steps (behind ``hpcddp timeline``, ``hpcddp.commands.timeline``).

``load_spans`` reads the Chrome trace into one set of lanes per rank: compute (forward,
backward, optimizer step), the DDP reducer (bucket launches, waits, copies back), one lane
per bucket's reduction in MPI, and the loader's waits. ``overlap`` gives the share of
reduction time that overlapped backward on the same rank; ``draw`` writes one band per
rank. Drawing needs matplotlib (``pip install matplotlib``).
"""

from typing import Dict, List, Tuple

from hpcddp import timeline

__all__ = ["backward_spans", "draw", "load_spans", "overlap", "pyplot", "reduction_spans"]

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
                         "extra: pip install '.[timeline]' in hpcddp's clone)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


Lane = Tuple[int, str]  # the trace's thread id and the name its metadata gives it


def load_spans(path) -> Dict[int, Dict[Lane, List[Span]]]:
    """``{rank: {(lane, lane name): [(start_ms, end_ms, name), ...]}}`` from a trace file;
    the lane names are those the trace itself records."""
    events = timeline.read_events(path)
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


def backward_spans(lanes) -> List[Span]:
    return sorted(s for spans in lanes.values() for s in spans if s[2] == "backward")


def reduction_spans(lanes) -> List[Span]:
    return [s for (_, name), spans in lanes.items() if name.endswith(_REDUCTION) for s in spans]


def overlap(ranks, skip: int = 2) -> Tuple[float, float]:
    """(reduction ms, of which overlapping a backward on the same rank), summed over
    every rank and every step after the first ``skip`` of each rank."""
    total = hidden = 0.0
    for lanes in ranks.values():
        backwards = backward_spans(lanes)
        if len(backwards) <= skip:
            continue
        since = backwards[skip][0]
        for start, end, _ in reduction_spans(lanes):
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
    backwards = backward_spans(lanes)
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
