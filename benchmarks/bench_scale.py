"""The model of scale (``hpcddp.commands.scale_model``) against the emulated cluster: the
fabric is fitted from messages between two ranks, then the model predicts the
allreduces and the DDP steps of other jobs on the same links, and each prediction is
set beside what those jobs measured (root only; ``testbed``).

    python benchmarks/bench_scale.py                     # about 15 minutes
    python benchmarks/bench_scale.py --rates 250mbit --layouts 2x1,4x1 --quick

For each link rate, on a cluster of as many nodes as the largest layout:

- the fit: ping-pong between two nodes (the link: its bandwidth from messages of 1 to
  16 MiB, its latency from 4 KiB ones; tbf's bucket lets the first 256 KiB of a burst
  through at once, so one straight line through every size would not do) and between two
  ranks of one node (shared memory: a least-squares line), and how fast a rank sums and
  copies;
- the check: on each layout, hpcddp's reductions at 1 and 16 MiB (``net_job.py
  allreduce``) and the step of bench_ddp's MLP with hpcddp's DDP (``net_job.py ddp``),
  against the model's prediction from the fitted fabric, the layout, the step's compute
  with no communication (measured in the same job: an input, not a fit) and its buckets.

Writes results/scale_model.json (``--name``): the fitted fabric per rate, and per point the measured
and predicted milliseconds and the error (predicted / measured - 1). Ranks use one torch
thread; UCX_TLS=tcp,self sends everything through the links.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench_network import _job  # noqa: E402
from hpcddp.commands.scale_model import (  # noqa: E402
    Fabric, Link, Workload, allreduce_seconds, ddp_step_seconds, fit_link)
from testbed import EmulatedCluster  # noqa: E402

NAME = "hdscale"
MEASURED = {"hpcddp_ring": "ring", "hpcddp_mpi": "mpi", "hpcddp_node": "node"}


def fit_fabric(cluster) -> dict:
    """The fabric fitted on ``cluster``'s links, with the samples it was fitted to."""
    sizes = "4,1024,4096,16384"
    across = _job(cluster, 2, 1, ["pingpong", "--sizes-kib", sizes, "--iters", "5"])
    inside = _job(cluster, 1, 2, ["pingpong", "--sizes-kib", sizes, "--iters", "5"])

    def medians(result):
        return [(row["bytes"], statistics.median(row["seconds"])) for row in result["rows"]]

    wire = medians(across)
    slope = fit_link([s for s in wire if s[0] >= 1 << 20])
    between = Link(wire[0][1], slope.bytes_per_s)
    within = fit_link(medians(inside))
    fabric = Fabric(between, within, inside["sum_bytes_per_s"], inside["copy_bytes_per_s"])
    return {"fabric": _said(fabric), "samples": {"between": wire, "within": medians(inside)},
            "model": fabric}


def _said(fabric: Fabric) -> dict:
    return {"between": {"latency_us": fabric.between.latency_s * 1e6,
                        "mbit_per_s": fabric.between.bytes_per_s * 8 / 1e6},
            "within": {"latency_us": fabric.within.latency_s * 1e6,
                       "gbyte_per_s": fabric.within.bytes_per_s / 1e9},
            "sum_gbyte_per_s": fabric.sum_bytes_per_s / 1e9,
            "copy_gbyte_per_s": fabric.copy_bytes_per_s / 1e9}


def _point(kind, layout, what, measured_ms, predicted_s):
    predicted_ms = predicted_s * 1e3
    return {"kind": kind, "layout": layout, "what": what, "measured_ms": measured_ms,
            "predicted_ms": predicted_ms, "error": predicted_ms / measured_ms - 1}


def check(cluster, fabric: Fabric, nodes: int, per_node: int, quick: bool) -> list:
    layout = f"{nodes}x{per_node}"
    points = []
    result = _job(cluster, nodes, per_node, ["allreduce", "--sizes-mib", "1,16",
                                              "--iters", "3" if quick else "5"])
    for row in result["rows"]:
        for name, reduction in MEASURED.items():
            if name in row:
                points.append(dict(
                    _point("allreduce", layout, f"{reduction} {row['bytes'] >> 20} MiB",
                           row[name]["median_ms"],
                           allreduce_seconds(fabric, nodes, per_node, row["bytes"], reduction)),
                    reduction=reduction, bytes=row["bytes"]))
    result = _job(cluster, nodes, per_node, ["ddp", "--steps", "5" if quick else "10",
                                              "--kinds", "no_communication,hpcddp"])
    steps = result["steps"]
    work = Workload(steps["no_communication"]["median_ms"] / 1e3,
                    tuple(result["bucket_bytes"]))
    predicted = ddp_step_seconds(fabric, nodes, per_node, work, result["reduction"])
    points.append(dict(_point("ddp step", layout, f"MLP, {result['reduction']}",
                              steps["hpcddp"]["median_ms"], predicted["step"]),
                       reduction=result["reduction"], compute_ms=work.compute_s * 1e3,
                       buckets=list(work.buckets)))
    return points


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rates", default="250mbit,500mbit")
    parser.add_argument("--layouts", default="2x1,4x1,2x2,8x1")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--name", default="scale_model", help="results/NAME.json")
    args = parser.parse_args()
    layouts = [tuple(int(n) for n in text.split("x")) for text in args.layouts.split(",")]
    runs = []
    for rate in args.rates.split(","):
        with EmulatedCluster.up(nodes=max(2, *(n for n, _ in layouts)), rate=rate,
                                name=NAME) as cluster:
            fitted = fit_fabric(cluster)
            print(f"{rate}: fitted {json.dumps(fitted['fabric'])}", flush=True)
            points = []
            for nodes, per_node in layouts:
                points += check(cluster, fitted["model"], nodes, per_node, args.quick)
                for p in points[-3:]:  # the 16 MiB rows and the step
                    print(f"{rate} {p['layout']} {p['kind']} {p['what']}: measured "
                          f"{p['measured_ms']:.1f} ms, model {p['predicted_ms']:.1f} ms "
                          f"({p['error']:+.0%})", flush=True)
        runs.append({"rate": rate, "fabric": fitted["fabric"], "samples": fitted["samples"],
                     "points": points})
    errors = [abs(p["error"]) for run in runs for p in run["points"]]
    summary = {"points": len(errors), "within_15_percent": sum(e <= 0.15 for e in errors),
               "median_abs_error": statistics.median(errors), "max_abs_error": max(errors)}
    out = HERE / "results" / f"{args.name}.json"
    out.write_text(json.dumps({"benchmark": "the model of scale against the emulated cluster "
                                            "(tbf-shaped links)",
                               "summary": summary, "runs": runs}, indent=1) + "\n")
    print(f"{json.dumps(summary)}\nwrote {out}")


if __name__ == "__main__":
    main()
