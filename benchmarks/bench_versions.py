"""bench_ddp for two versions of hpcddp, alternately, on one machine: the same job with
another checkout's hpcddp (and its own bench_ddp.py) and with this one's.

    python benchmarks/bench_versions.py /tmp/old-checkout --repeats 2 --name ddp_before_after

Each repeat runs "before" then "after", the next "after" then "before", so that a drift
of the machine falls on both. results/<name>.json holds every run, and per model the
median over the runs of hpcddp's step, torch DDP's step, their ratio and the exposed
communication against one raw allreduce.
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


def _run(tree: Path, models: str, steps: int, out: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    command = [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable,
               str(tree / "benchmarks" / "bench_ddp.py"), "--models", models,
               "--steps", str(steps), "--name", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tree,
                          timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"bench_ddp in {tree} failed:\n{done.stdout[-2000:]}"
                           f"\n{done.stderr[-2000:]}")
    return json.loads(out.with_suffix(".json").read_text())


def _git(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("before", help="a checkout of the earlier version")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", default="mlp")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--name", default="ddp_before_after")
    args = parser.parse_args()
    trees = {"before": Path(args.before).resolve(), "after": ROOT}
    runs = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ("before", "after") if repeat % 2 == 0 else ("after", "before")
            for version in order:
                out = Path(tmp) / f"{version}-{repeat}"
                runs[version].append(_run(trees[version], args.models, args.steps, out))
                print(f"{version} {repeat} done", flush=True)
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
    path = HERE / "results" / f"{args.name}.json"
    path.write_text(json.dumps({
        "benchmark": "bench_ddp at 2 ranks, two versions of hpcddp alternately",
        "code": {version: _git(tree) for version, tree in trees.items()},
        "summary": summary, "runs": runs}, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
