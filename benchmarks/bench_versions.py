"""bench_ddp for two versions of hpcddp, alternately, on one machine: the same job with
another checkout's hpcddp (and its own bench_ddp.py) and with this one's.

    python benchmarks/bench_versions.py /tmp/old-checkout --repeats 2 --name ddp_before_after

Each repeat runs "before" then "after", the next "after" then "before", so that a drift
of the machine falls on both. results/<name>.json holds every run, and per model the
median over the runs of hpcddp's step, torch DDP's step, their ratio and the exposed
communication against one raw allreduce.

``--bench breakdown`` runs this checkout's ``bench_ddp_breakdown.py`` around each
version's hpcddp instead (the backward on busy and on idle cores); the summary holds, per
variant, the median exposed communication and its ratio to one raw allreduce.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _run(tree: Path, models: str, steps: int, out: Path, bench: str = "ddp") -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    command = [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable]
    if bench == "ddp":
        command += [str(tree / "benchmarks" / "bench_ddp.py"), "--models", models]
    else:  # this checkout's harness around either version's reducer
        command += [str(HERE / "bench_ddp_breakdown.py")]
    command += ["--steps", str(steps), "--name", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"bench_ddp in {tree} failed:\n{done.stdout[-2000:]}"
                           f"\n{done.stderr[-2000:]}")
    return json.loads(out.with_suffix(".json").read_text())


def _git(tree: Path) -> str:
    """The checkout's commit, with "-dirty" where its files differ from it."""
    return subprocess.run(["git", "-C", str(tree), "describe", "--always", "--dirty",
                           "--abbrev=7", "--match=none"],
                          capture_output=True, text=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("before", help="a checkout of the earlier version")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--name", default="ddp_before_after")
    parser.add_argument("--bench", choices=("ddp", "breakdown"), default="ddp",
                        help="bench_ddp, or bench_ddp_breakdown (busy and idle cores)")
    args = parser.parse_args()
    trees = {"before": Path(args.before).resolve(), "after": ROOT}
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
            for version in order:
                out = Path(tmp) / f"{version}-{repeat}"
                runs[version].append(_run(trees[version], args.models, args.steps, out,
                                          args.bench))
                print(f"{version} {repeat} done", flush=True)
    if args.bench == "breakdown":
        return _write(args.name, "bench_ddp_breakdown at 2 ranks, two versions of hpcddp "
                      "alternately", trees, _breakdown_summary(runs), runs)
    summary = {}
    for model in args.models.split(","):
        summary[model] = {}
        for version, results in runs.items():
            rows = [next(r for r in run["results"] if r["model"] == model) for run in results]
            ms = lambda key: statistics.median(r["step_ms"][key] for r in rows)  # noqa: E731
            exposed = statistics.median(r["exposed_comm_ms"]["hpcddp"] for r in rows)
            summary[model][version] = {
                "hpcddp_ms": ms("hpcddp"), "torch_ddp_gloo_ms": ms("torch_ddp_gloo"),
                "raw_allreduce_ms": ms("raw_allreduce"),
                "hpcddp_vs_torch_ddp": statistics.median(
                    r["step_ms"]["hpcddp"] / r["step_ms"]["torch_ddp_gloo"] for r in rows),
                "exposed_vs_raw_allreduce": statistics.median(
                    r["exposed_comm_ms"]["hpcddp"] / r["step_ms"]["raw_allreduce"]
                    for r in rows),
                "exposed_ms": exposed}
        b, a = summary[model]["before"], summary[model]["after"]
        summary[model]["after_over_before_vs_torch"] = (a["hpcddp_vs_torch_ddp"] /
                                                        b["hpcddp_vs_torch_ddp"])
    _write(args.name, "bench_ddp at 2 ranks, two versions of hpcddp alternately", trees,
           summary, runs)


def _breakdown_summary(runs) -> dict:
    """Per variant, with the backward on the CPU and on idle cores: the median over the
    runs of the exposed communication and of its ratio to one raw allreduce."""
    summary = {}
    for version, results in runs.items():
        for cores in ("cpu_compute", "idle_cores"):
            for variant in results[0]["results"][cores]["variants"]:
                rows = [run["results"][cores]["variants"][variant] for run in results]
                summary.setdefault(cores, {}).setdefault(variant, {})[version] = {
                    "exposed_ms": statistics.median(r["exposed_ms"] for r in rows),
                    "exposed_vs_raw_allreduce": statistics.median(
                        r["exposed_vs_raw_allreduce"] for r in rows)}
    return summary


def _write(name: str, what: str, trees, summary, runs) -> None:
    path = HERE / "results" / f"{name}.json"
    path.write_text(json.dumps({
        "benchmark": what, "code": {version: _git(tree) for version, tree in trees.items()},
        "summary": summary, "runs": runs}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
