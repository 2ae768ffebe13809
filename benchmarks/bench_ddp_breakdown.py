"""Where an hpcddp DDP step spends its communication time (MLP, 24 MiB of gradients).

Run: ``mpiexec -n 2 python benchmarks/bench_ddp_breakdown.py``. Wraps the reducer's
phases with timers: the gradient hooks (copy into buckets, ``Test``-driven progress),
launching, and the end-of-backward callback (agreement, waiting, copy back).
"""

import functools
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
from common import write

PHASES = ("hooks", "progress_in_hooks", "launch", "end_of_backward", "wait_and_copy_back")


def _timed(totals, name, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start
    return wrapper


def main(steps=40, warmup=5):
    world = hpcddp.init()
    layers = []
    for _ in range(6):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    ddp = hpcddp.DistributedDataParallel(nn.Sequential(*layers[:-1]))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    x, y = torch.randn(64, 1024), torch.randn(64, 1024)
    totals = dict.fromkeys(PHASES, 0.0)
    red = ddp.reducer
    red.progress = _timed(totals, "progress_in_hooks", red.progress)
    red._launch_ready = _timed(totals, "launch", red._launch_ready)
    red._finalize = _timed(totals, "end_of_backward", red._finalize)
    red._wait_and_copy = _timed(totals, "wait_and_copy_back", red._wait_and_copy)
    on_grad = _timed(totals, "hooks", red._on_grad)
    for hook in red._hooks:
        hook.remove()
    red._hooks = [p.register_post_accumulate_grad_hook(functools.partial(on_grad, i))
                  for i, p in enumerate(red.params)]
    step_times = []
    for step in range(warmup + steps):
        if step == warmup:
            totals.update(dict.fromkeys(PHASES, 0.0))
        world.comm.Barrier()
        start = time.perf_counter()
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        step_times.append(time.perf_counter() - start)
    per_step = {k: v / steps * 1e3 for k, v in totals.items()}
    result = {"model": "mlp", "buckets": [layout.numel * 4 for layout in red.layouts],
              "step_ms": float(np.median(step_times[warmup:]) * 1e3), "phase_ms": per_step}
    if world.is_main:
        print(f"step {result['step_ms']:.2f} ms; buckets (bytes) {result['buckets']}")
        for name, ms in per_step.items():
            print(f"  {name:20} {ms:7.2f} ms per step")
    write("ddp_breakdown", result, world)


if __name__ == "__main__":
    main()
