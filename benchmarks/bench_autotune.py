"""``bucket_cap_mb="auto"`` against the defaults and against the best of a grid search over
the same space, all in one job per configuration.

    python benchmarks/bench_autotune.py                   # shared memory, then 1 and 2.5
                                                          # Gbit/s on emulated nodes (root)
    python benchmarks/bench_autotune.py --where shm       # one configuration
    mpiexec -n 2 python benchmarks/bench_autotune.py job  # one job, by hand

In each job, for each model (bench_ddp's MLP and a small transformer):

1. grid: every setting of the autotuner's space (reductions, large parameters alone or
   not, every bucket cap, every first-bucket cap), each measured as the autotuner
   measures it (one warm-up step, then the median of 3), switched on one wrapper with
   the reducer's own ``retune``; its cheapest is the grid's best;
2. auto: a fresh wrapper with ``bucket_cap_mb="auto"`` trained until it settles; every
   search step is timed, so the search's cost is the time those steps took beyond the
   same number of steps at the chosen setting;
3. the defaults, auto's choice and the grid's best, timed in turn (interleaved) for
   ``--steps`` steps each: whole training steps (forward, backward, communication,
   optimizer), the slowest rank's, median.

Writes results/autotune.json. Ranks use one torch thread; on emulated nodes
UCX_TLS=tcp,self sends everything through the shaped links.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

NAME = "hdtune"
RUN_STEPS = 500  # the run the search's cost is stated against


# -- the job (under mpiexec) -------------------------------------------------------------

def _models():
    import torch
    from torch import nn

    from bench_ddp import mlp

    class SmallGPT(nn.Module):
        """An 8-layer pre-norm transformer, d=192, vocabulary 4096 (about 20 MiB): every
        tensor of its blocks is under 1 MiB, so the blocks' gradients share buckets."""

        def __init__(self, vocab=4096, d=192, layers=8, context=64):
            super().__init__()
            self.embed = nn.Embedding(vocab, d)
            self.position = nn.Parameter(torch.zeros(context, d))
            block = nn.TransformerEncoderLayer(d, 4, 4 * d, dropout=0.0, batch_first=True,
                                               norm_first=True)
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.head = nn.Linear(d, vocab)

        def forward(self, tokens):
            return self.head(self.blocks(self.embed(tokens) + self.position))

    def gpt_batch():
        tokens = torch.randint(0, 4096, (8, 65))
        return tokens[:, :-1], tokens[:, 1:]

    def gpt_loss(out, y):
        return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))

    def mse(out, y):
        return nn.functional.mse_loss(out, y)

    return {"mlp": (mlp, lambda: (torch.randn(64, 1024), torch.randn(64, 1024)), mse),
            "small_transformer": (SmallGPT, gpt_batch, gpt_loss)}


def _grid(tuner):
    from hpcddp.ddp.search import Setting
    space = tuner.space
    return [Setting(r, s, c, f) for r in space.reductions for s in space.solos
            for c in space.caps for f in space.firsts(c)]


def _bench_model(world, make, batch, loss_fn, steps):
    import numpy as np
    import torch
    from mpi4py import MPI

    import hpcddp
    from hpcddp.ddp.autotune import apply_setting

    comm = world.comm
    torch.manual_seed(0)
    x, y = batch()

    def timed_step(ddp, opt):
        comm.Barrier()
        began = time.perf_counter()
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        return comm.allreduce(time.perf_counter() - began, op=MPI.MAX)

    def wrapper(**kwargs):
        ddp = hpcddp.DistributedDataParallel(make(), **kwargs)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-5)

    # 1. auto, from a fresh wrapper, every step timed until it settles.
    auto, auto_opt = wrapper(bucket_cap_mb="auto")
    search_steps = []
    while not auto.tuner.settled:
        search_steps.append(timed_step(auto, auto_opt))
    tuner = auto.tuner
    chosen = tuner.search.best_setting

    # 2. the grid over the same space, on one wrapper switched by the reducer's retune.
    probe, probe_opt = wrapper()
    for _ in range(2):  # the first-iteration bucket rebuild happens here
        timed_step(probe, probe_opt)
    grid = []
    for setting in _grid(tuner):
        apply_setting(probe.reducer, setting, tuner.solo_bytes)
        timed_step(probe, probe_opt)  # warm-up, as the tuner's
        grid.append((float(np.median([timed_step(probe, probe_opt) for _ in range(3)])),
                     setting))
    grid_best = min(grid)[1]

    # 3. defaults, auto's choice and the grid's best, interleaved on the probe wrapper.
    default, _ = wrapper()
    start = default.reducer
    defaults = (start.transport.reduction.name, start.cap_bytes, start.first_cap_bytes,
                start.solo_bytes)
    default.close()
    runs = {"default": lambda: probe.reducer.retune(*defaults),
            "auto": lambda: apply_setting(probe.reducer, chosen, tuner.solo_bytes),
            "grid_best": lambda: apply_setting(probe.reducer, grid_best, tuner.solo_bytes)}
    samples = {name: [] for name in runs}
    for _ in range(steps):
        for name, apply in runs.items():
            apply()
            timed_step(probe, probe_opt)  # warm-up after the switch
            samples[name].append(timed_step(probe, probe_opt))
    median = {name: float(np.median(v)) for name, v in samples.items()}
    spent = sum(search_steps) - len(search_steps) * median["auto"]
    result = {
        "gradient_mib": sum(p.numel() * p.element_size()
                            for p in probe.module.parameters()) / (1 << 20),
        "space": {"reductions": list(tuner.space.reductions), "solos": list(tuner.space.solos),
                  "caps_mb": list(tuner.space.caps), "grid_points": len(grid)},
        "default": {"setting": list(defaults), "step_ms": median["default"] * 1e3},
        "auto": {"setting": dict(chosen._asdict()), "step_ms": median["auto"] * 1e3,
                 "search_steps": len(search_steps), "settings_tried": len(tuner.search.history),
                 "search_extra_ms": spent * 1e3,
                 "search_cost_share_of_500_steps": spent / (RUN_STEPS * median["auto"])},
        "grid_best": {"setting": dict(grid_best._asdict()), "step_ms": median["grid_best"] * 1e3,
                      "search_ms": min(grid)[0] * 1e3},
        "grid": [dict(s._asdict(), step_ms=t * 1e3) for t, s in sorted(grid)],
        "ratios": {"auto_vs_grid_best": median["auto"] / median["grid_best"],
                   "auto_vs_default": median["auto"] / median["default"]},
    }
    for ddp in (auto, probe):
        ddp.close()
    return result


def job(args):
    import torch

    import hpcddp
    sys.path.insert(0, str(HERE))
    torch.set_num_threads(1)
    world = hpcddp.init()
    out = {"world_size": world.size, "nodes": world.num_nodes, "models": {}}
    for name, (make, batch, loss_fn) in _models().items():
        if args.models and name not in args.models.split(","):
            continue
        out["models"][name] = _bench_model(world, make, batch, loss_fn, args.steps)
        if world.is_main:
            print(f"{name}: {json.dumps(out['models'][name]['ratios'])}", file=sys.stderr,
                  flush=True)
    if world.is_main:
        print("RESULT " + json.dumps(out), flush=True)
    hpcddp.shutdown()


# -- the driver --------------------------------------------------------------------------

def _run(command, env):
    done = subprocess.run(command, capture_output=True, text=True, cwd=HERE, timeout=3600,
                          env=env)
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n"
                       f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


def _job_argv(args):
    return [sys.executable, str(Path(__file__).resolve()), "job", "--steps", str(args.steps),
            *(["--models", args.models] if args.models else [])]


def drive(args):
    from testbed import EmulatedCluster
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    common = ["-genv", "HPCDDP_NUM_THREADS", "1", "-genv", "OMP_NUM_THREADS", "1"]
    runs = []
    for where in args.where.split(","):
        if where == "shm":
            env = dict(os.environ, HPCDDP_NUM_THREADS="1", OMP_NUM_THREADS="1")
            result = _run([mpiexec, "-n", "2", *_job_argv(args)], env)
            runs.append(dict(result, where="shared memory, 1 node x 2 ranks"))
        else:
            with EmulatedCluster.up(nodes=2, rate=where, name=NAME) as cluster:
                result = _run([mpiexec, *cluster.mpiexec_args(1, cluster.nodes[:2]), *common,
                               *_job_argv(args)], cluster.env())
            runs.append(dict(result, where=f"emulated, 2 nodes x 1 rank, {where} links"))
        for model, r in runs[-1]["models"].items():
            print(f"{runs[-1]['where']} {model}: default {r['default']['step_ms']:.1f} ms, "
                  f"auto {r['auto']['step_ms']:.1f} ms, grid best {r['grid_best']['step_ms']:.1f}"
                  f" ms; auto/grid {r['ratios']['auto_vs_grid_best']:.3f}, auto/default "
                  f"{r['ratios']['auto_vs_default']:.3f}, search cost "
                  f"{r['auto']['search_cost_share_of_500_steps']:.2%} of 500 steps", flush=True)
        _write(runs)


def _write(runs):
    """Write results/autotune.json, keeping the models of earlier runs that this one did
    not measure (``--models``)."""
    out = HERE / "results" / "autotune.json"
    old = json.loads(out.read_text())["runs"] if out.exists() else []
    merged = []
    for run in runs:
        earlier = next((r for r in old if r["where"] == run["where"]), None)
        models = dict(earlier["models"]) if earlier else {}
        models.update(run["models"])
        merged.append(dict(run, models=models))
    merged += [r for r in old if r["where"] not in {m["where"] for m in merged}]
    out.write_text(json.dumps({"benchmark": "bucket_cap_mb='auto' against the defaults and "
                                            "the best of a grid over the same space",
                               "runs": merged}, indent=1) + "\n")
    print(f"wrote {out}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="drive", choices=("drive", "job"))
    parser.add_argument("--where", default="shm,1gbit,2.5gbit",
                        help="shm and/or link rates for 2 emulated nodes")
    parser.add_argument("--steps", type=int, default=15,
                        help="interleaved steps per setting in the final comparison")
    parser.add_argument("--models", default="", help="e.g. mlp (default: both)")
    args = parser.parse_args()
    (job if args.mode == "job" else drive)(args)


if __name__ == "__main__":
    main()
