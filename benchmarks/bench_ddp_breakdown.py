"""Where an hpcddp DDP step's exposed communication goes (MLP, 24 MiB of gradients).

Run: ``mpiexec -n 2 python benchmarks/bench_ddp_breakdown.py``. Each variant's reducer
is wrapped with timers, and all variants run interleaved, step by step, in one job:

- copies into the buckets (the gradient hooks, less their MPI calls) and back into
  ``.grad`` at the end (``_wait_and_copy`` less the waits), with and without
  ``gradient_as_bucket_view``;
- the bucket layout, and which bucket is launched last and how large it is;
- how many ``Test`` calls reach a pending reduction, during backward and after it;
- bucket caps (one bucket, torch's 1 MiB first bucket, a bucket per layer) and the
  progress thread, all with every parameter copied into a bucket
  (``HPCDDP_SOLO_BUCKET_KB=0``), and the default, where each 4 MiB weight is reduced in
  its own gradient (a solo bucket), with and without the progress thread.

Every variant runs twice: with the backward computed on the CPU, and with each layer's
backward replaced by a sleep of the same length that returns gradients of the same
sizes ("idle cores"). On a 2-core machine with 2 ranks the reduction, which is CPU work
on shared memory, can only run on the cores that compute the backward; with the compute
off the cores (as on a GPU) it can overlap. The difference between the two is what the
competition for cores costs.
"""

import argparse
import functools
import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn

import hpcddp
from hpcddp.ddp.grad_bucket import GradBucket
from common import median_ms, timed, write

WIDTH, LAYERS, BATCH = 1024, 6, 64


def mlp():
    layers = []
    for _ in range(LAYERS):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class _SleepingBackward(torch.autograd.Function):
    """The identity forward; a backward that sleeps, then returns gradients for the
    layer's weight and bias (the core is idle meanwhile, as under a GPU's compute)."""

    @staticmethod
    def forward(ctx, x, weight, bias, seconds):
        ctx.seconds, ctx.shapes = seconds, (weight.shape, bias.shape)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, torch.full(ctx.shapes[0], 1e-3), torch.full(ctx.shapes[1], 1e-3), None


class IdleLinear(nn.Linear):
    """A ``Linear``'s parameters, with a backward that leaves the core idle."""

    def __init__(self, seconds):
        super().__init__(WIDTH, WIDTH)
        self.seconds = seconds

    def forward(self, x):
        return _SleepingBackward.apply(x, self.weight, self.bias, self.seconds)


def idle_mlp(seconds):
    return nn.Sequential(*[IdleLinear(seconds) for _ in range(LAYERS)])


def backward_seconds_per_layer(comm, repeats=20):
    """The MLP's backward time per layer on this machine, agreed across ranks."""
    model, x, y = mlp(), torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    samples = []
    for _ in range(repeats):
        loss = F.mse_loss(model(x), y)
        start = time.perf_counter()
        loss.backward()
        samples.append(time.perf_counter() - start)
    return comm.allreduce(float(np.median(samples)), op=MPI.MAX) / LAYERS


class Phases:
    """Timers and counters wrapped around one reducer's phases."""

    active = None  # the Phases of the variant stepping now (bucket waits are timed per class)

    NAMES = ("hooks", "test_and_launch_in_hooks", "agree", "wait", "wait_and_copy_back")

    def __init__(self, ddp):
        self.ms = dict.fromkeys(self.NAMES, 0.0)
        self.tests = {"in_backward": 0}
        red, transport = ddp.reducer, ddp.reducer.transport
        red.progress = self._timed("test_and_launch_in_hooks", red.progress)
        red._launch_ready = self._timed("test_and_launch_in_hooks", red._launch_ready)
        red._agree = self._timed("agree", red._agree)
        red._wait_and_copy = self._timed("wait_and_copy_back", red._wait_and_copy)
        advance = transport.advance

        def counted_advance():
            # The end of backward waits (MPI_Wait) instead; a Test that found its
            # reduction pending during backward is what hook-driven progress costs.
            self.tests["in_backward"] += sum(1 for p in transport._issued if not p.done)
            return advance()
        transport.advance = counted_advance
        on_grad = self._timed("hooks", red._on_grad)
        for hook in red._hooks:
            hook.remove()
        red._hooks = [p.register_post_accumulate_grad_hook(functools.partial(on_grad, i))
                      for i, p in enumerate(red.params)]

    def _timed(self, name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[name] += (time.perf_counter() - start) * 1e3
        return wrapper

    def reset(self):
        self.ms = dict.fromkeys(self.NAMES, 0.0)
        self.tests = dict.fromkeys(self.tests, 0)

    def per_step(self, comm, steps):
        """Per step, the mean over ranks (a rank that waits for a slower one in the
        agreement shows that wait; the mean halves it at 2 ranks)."""
        ms = {k: comm.allreduce(v, op=MPI.SUM) / comm.size / steps for k, v in self.ms.items()}
        # The hooks include their MPI calls; what is left is the copy (with the division)
        # into the bucket. The end includes the waits; what is left is the copy back.
        ms["copy_into_buckets"] = ms["hooks"] - ms["test_and_launch_in_hooks"]
        ms["copy_back"] = ms["wait_and_copy_back"] - ms["wait"]
        tests = {k: comm.allreduce(v, op=MPI.SUM) / comm.size / steps
                 for k, v in self.tests.items()}
        return {"phase_ms": ms, "tests_per_step": tests}


VARIANTS = {
    # name: DistributedDataParallel keyword arguments, progress thread, solo buckets
    "one_bucket_cap25": ({"bucket_cap_mb": 25}, False, False),
    "default_first_bucket_1MiB": ({}, False, False),
    "bucket_per_layer_cap4": ({"bucket_cap_mb": 4}, False, False),
    "bucket_view_cap25": ({"bucket_cap_mb": 25, "gradient_as_bucket_view": True}, False,
                          False),
    "progress_thread_cap4": ({"bucket_cap_mb": 4}, True, False),
    "progress_thread_cap4_bucket_view": ({"bucket_cap_mb": 4,
                                          "gradient_as_bucket_view": True}, True, False),
    "solo_weights_default": ({}, False, True),
    "solo_weights_progress_thread": ({}, True, True),
}


def _stepper(model, x, y):
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return step


def _timed_finish():
    """Time every bucket's wait, for the variant stepping now."""
    finish = GradBucket.finish

    def timed_finish(bucket):
        start = time.perf_counter()
        try:
            return finish(bucket)
        finally:
            if Phases.active is not None:
                Phases.active.ms["wait"] += (time.perf_counter() - start) * 1e3
    GradBucket.finish = timed_finish


def _active(phases, step):
    def run():
        Phases.active = phases
        try:
            step()
        finally:
            Phases.active = None
    return run


def run(world, make, steps, warmup):
    x, y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)
    torch.manual_seed(0)
    base = make()
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    flat = np.ones(grad_bytes // 4, dtype=np.float32)
    runs = {"no_communication": _stepper(make(), x, y)}
    wrapped = {}
    for name, (kwargs, thread, solo) in VARIANTS.items():
        if not solo:
            os.environ["HPCDDP_SOLO_BUCKET_KB"] = "0"
        ddp = hpcddp.DistributedDataParallel(make(), **kwargs)
        os.environ.pop("HPCDDP_SOLO_BUCKET_KB", None)
        ddp.reducer.progress_thread = thread
        wrapped[name] = (ddp, Phases(ddp))
        runs[name] = _active(wrapped[name][1], _stepper(ddp, x, y))
    runs["raw_allreduce"] = lambda: world.comm.Allreduce(MPI.IN_PLACE, flat)
    for _ in range(warmup):
        for fn in runs.values():
            fn()  # includes the bucket rebuild after the first step
    for _, phases in wrapped.values():
        phases.reset()
    samples = {k: [] for k in runs}
    for _ in range(steps):
        for key, fn in runs.items():
            samples[key].append(timed(world.comm, fn))
    ms = {k: median_ms(v) for k, v in samples.items()}
    out = {"grad_bytes": grad_bytes, "step_ms": ms, "variants": {}}
    for name, (ddp, phases) in wrapped.items():
        layouts = ddp.reducer.layouts
        exposed = ms[name] - ms["no_communication"]
        out["variants"][name] = {
            "exposed_ms": exposed, "exposed_vs_raw_allreduce": exposed / ms["raw_allreduce"],
            "bucket_bytes_in_launch_order": [layout.numel * 4 for layout in layouts],
            "solo_buckets": sum(layout.solo for layout in layouts),
            "last_bucket_bytes": layouts[-1].numel * 4,
            **phases.per_step(world.comm, steps)}
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--name", default="ddp_breakdown", help="results/<name>.json")
    args = parser.parse_args()
    world = hpcddp.init()
    _timed_finish()
    seconds = backward_seconds_per_layer(world.comm)
    results = {"backward_ms_per_layer": seconds * 1e3,
               "cpu_compute": run(world, mlp, args.steps, args.warmup),
               "idle_cores": run(world, lambda: idle_mlp(seconds), args.steps, args.warmup)}
    cpu, idle = results["cpu_compute"]["variants"], results["idle_cores"]["variants"]
    results["competition_ms"] = {k: cpu[k]["exposed_ms"] - idle[k]["exposed_ms"] for k in cpu}
    if world.is_main:
        for kind in ("cpu_compute", "idle_cores"):
            r = results[kind]
            print(f"\n{kind}: no communication {r['step_ms']['no_communication']:.2f} ms, "
                  f"raw allreduce {r['step_ms']['raw_allreduce']:.2f} ms")
            for name, v in r["variants"].items():
                p = v["phase_ms"]
                print(f"  {name:34} exposed {v['exposed_ms']:6.2f} ms "
                      f"({v['exposed_vs_raw_allreduce']:.2f}x)  copy in {p['copy_into_buckets']:.2f}"
                      f"  test+launch {p['test_and_launch_in_hooks']:.2f}  agree {p['agree']:.2f}"
                      f"  wait {p['wait']:.2f}  copy back {p['copy_back']:.2f}  tests "
                      f"{v['tests_per_step']}  last bucket {v['last_bucket_bytes'] / 1024:.0f} KiB",
                      flush=True)
    write(args.name, {"benchmark": "DDP exposed communication, by phase",
                      "steps": args.steps, "results": results}, world)


if __name__ == "__main__":
    main()
