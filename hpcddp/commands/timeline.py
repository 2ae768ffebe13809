"""``hpcddp timeline``: draw a few training steps of a timeline, and say how much of the
gradient reduction hid behind backward.

Reads the Chrome trace that ``HPCDDP_TIMELINE`` wrote and draws one band per rank, with a
row per lane: compute (forward, backward, optimizer step), the DDP reducer (bucket
launches, waits, copies back), one row per bucket's reduction in MPI, and the loader's
waits. It prints, over every step after the first ``--skip``, the share of reduction time
that overlapped backward on the same rank. Needs matplotlib (``pip install matplotlib``).
"""

import sys

from hpcddp.commands.parser import command_parser
from hpcddp.timeline.plot import backward_spans, draw, load_spans, overlap, reduction_spans

__all__ = ["main"]


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
        count = len(backward_spans(ranks[rank]))
        print(f"rank {rank}: {count} backward passes, "
              f"{len(reduction_spans(ranks[rank]))} bucket reductions")
    if total:
        print(f"bucket reductions: {total:.1f} ms in all, {hidden:.1f} ms "
              f"({100 * hidden / total:.0f} %) overlapping backward")
    draw(ranks, args.output, args.first, args.steps)
    print(f"wrote {args.output}")
    return 0
