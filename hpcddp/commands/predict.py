"""``hpcddp predict``: what a DDP step would cost on a layout, from a model, before the
allocation is spent.

For each node count it prints the reduction ``HPCDDP_REDUCE=auto`` would choose there
(on host buffers), each reduction's predicted step, and the scaling efficiency (the
compute-only step over the step), from ``hpcddp.commands.scale_model``: a model of
latency and bandwidth per link and per node, and buckets reduced one after the other
as the backward frees them. The figures are a model's, never a measurement; how close
it comes on the emulated cluster is in the README (benchmarks/bench_scale.py). The
``mpi`` column assumes the MPI library runs Rabenseifner's allreduce; a library that
chooses another algorithm takes longer (MPICH 5 over TCP: up to 2.1 times on 8 nodes).

The fabric is a fitted one (``--fabric results/scale_model.json --rate 500mbit``) or
given by its links (``--link-gbit``, ``--link-latency-us``, ``--within-gbyte``...). The
workload: the gradients' size, the bucket cap (hpcddp's first bucket holds 1 MiB) and
the compute of one step with no communication (time it on one rank).

Example::

    hpcddp predict --nodes 2,4,8,16 --ranks-per-node 8 --link-gbit 200 \\
        --within-gbyte 150 --grad-mib 98 --compute-ms 120
"""

import json
from typing import List

from hpcddp.commands.parser import command_parser
from hpcddp.commands.scale_model import REDUCTIONS, Fabric, Link, Workload, ddp_step_seconds
from hpcddp.ddp.buckets import FIRST_BUCKET_BYTES
from hpcddp.transport.allreduce.policy import HOST, WorldFacts, for_world

__all__ = ["main", "bucket_bytes", "fabric_from_file"]

_MIB = 1 << 20


def bucket_bytes(grad_bytes: int, cap_bytes: int) -> List[int]:
    """Buckets as hpcddp lays them out for gradients of ``grad_bytes`` in parameters
    no larger than a bucket, in the order they are reduced: the first bucket's cap
    (``hpcddp.ddp.buckets``, 1 MiB) first, then
    ``cap_bytes`` each, the rest last."""
    if grad_bytes <= 0 or cap_bytes <= 0:
        raise ValueError(f"gradients of {grad_bytes} bytes in buckets of {cap_bytes}: both "
                         "must be positive")
    first = min(grad_bytes, FIRST_BUCKET_BYTES)
    buckets, left = [first], grad_bytes - first
    while left > 0:
        buckets.append(min(left, cap_bytes))
        left -= buckets[-1]
    return buckets


def fabric_from_file(path: str, rate: str) -> Fabric:
    """The fabric ``benchmarks/bench_scale.py`` fitted at ``rate`` (its results file)."""
    with open(path) as f:
        runs = {run["rate"]: run["fabric"] for run in json.load(f)["runs"]}
    if rate not in runs:
        raise ValueError(f"--rate {rate!r}: {path} has fits at {', '.join(runs)}; choose one")
    fit = runs[rate]
    return Fabric(Link(fit["between"]["latency_us"] / 1e6, fit["between"]["mbit_per_s"] * 1e6 / 8),
                  Link(fit["within"]["latency_us"] / 1e6, fit["within"]["gbyte_per_s"] * 1e9),
                  fit["sum_gbyte_per_s"] * 1e9, fit["copy_gbyte_per_s"] * 1e9)


def _parser():
    parser = command_parser("predict", __doc__)
    parser.add_argument("--nodes", default="1,2,4,8", help="node counts (default 1,2,4,8)")
    parser.add_argument("--ranks-per-node", type=int, default=1)
    parser.add_argument("--fabric", default=None, metavar="FILE",
                        help="a fitted fabric: bench_scale.py's results/scale_model.json")
    parser.add_argument("--rate", default=None, help="which of --fabric's fits (its rate)")
    parser.add_argument("--link-gbit", type=float, default=100.0,
                        help="a node's link, per direction (default 100)")
    parser.add_argument("--link-latency-us", type=float, default=5.0)
    parser.add_argument("--within-gbyte", type=float, default=20.0,
                        help="between two ranks of a node, GB/s (default 20)")
    parser.add_argument("--within-latency-us", type=float, default=1.0)
    parser.add_argument("--sum-gbyte", type=float, default=20.0,
                        help="a rank summing buffers, GB/s of input (default 20)")
    parser.add_argument("--copy-gbyte", type=float, default=20.0,
                        help="a rank copying gradients into buckets, GB/s (default 20)")
    parser.add_argument("--grad-mib", type=float, required=True,
                        help="the gradients' size (fp32: 4 bytes per parameter)")
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--compute-ms", type=float, required=True,
                        help="one step's forward, backward and optimizer, no communication")
    parser.add_argument("--json", action="store_true", help="rows as JSON lines")
    return parser


def main(argv=None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        nodes = [int(n) for n in args.nodes.split(",")]
        if args.fabric:
            fabric = fabric_from_file(args.fabric, args.rate or "")
        else:
            fabric = Fabric(Link(args.link_latency_us / 1e6, args.link_gbit * 1e9 / 8),
                            Link(args.within_latency_us / 1e6, args.within_gbyte * 1e9),
                            args.sum_gbyte * 1e9, args.copy_gbyte * 1e9)
        work = Workload(args.compute_ms / 1e3,
                        tuple(bucket_bytes(int(args.grad_mib * _MIB), int(args.bucket_mb * _MIB))))
    except (ValueError, OSError, KeyError) as error:
        parser.error(str(error))
    if not args.json:
        print("model, not measurement: " + ", ".join(
            f"{n}" for n in (f"link {fabric.between.bytes_per_s * 8 / 1e9:.3g} Gbit/s",
                             f"{fabric.between.latency_s * 1e6:.3g} us",
                             f"{len(work.buckets)} buckets", f"compute {args.compute_ms:g} ms")))
        print(f"{'nodes':>5} {'ranks':>6} {'auto':>5} " +
              " ".join(f"{r + ' ms':>9}" for r in REDUCTIONS) + f" {'efficiency':>10}")
    for count in nodes:
        layout = WorldFacts(count, args.ranks_per_node, True, HOST)
        auto = for_world("auto", layout).name
        steps = {r: ddp_step_seconds(fabric, count, args.ranks_per_node, work, r)
                 for r in REDUCTIONS}
        efficiency = work.compute_s / steps[auto]["step"]
        if args.json:
            print(json.dumps({"nodes": count, "ranks_per_node": args.ranks_per_node,
                              "auto": auto, "efficiency": efficiency,
                              "steps_ms": {r: s["step"] * 1e3 for r, s in steps.items()}}))
        else:
            print(f"{count:>5} {count * args.ranks_per_node:>6} {auto:>5} " +
                  " ".join(f"{steps[r]['step'] * 1e3:>9.1f}" for r in REDUCTIONS) +
                  f" {efficiency:>10.2f}")
    return 0
