"""torch.compile and overlap: when the first bucket is launched, as a fraction of
backward, eager against compiled, and whether compiled gradients equal eager ones.

Three ways to compile under hpcddp's DDP, on 4 residual MLP blocks (8 layers, 32 MiB
of gradients, 2 MiB buckets):

- ``eager``: no compilation;
- ``compiled_whole``: ``DDP(torch.compile(model))``: one graph, so AOTAutograd produces
  every gradient at the end of one fused backward and the first launch moves to its end;
- ``compiled_per_block``: each block compiled on its own (``block.compile()``), the
  pattern the docs recommend (docs/ddp.md): a graph per block, whose gradients are ready as soon
  as its backward has run, so buckets launch during backward as in eager mode.

Run: ``mpiexec -n 2 python benchmarks/bench_compile.py``.
"""

import argparse
import copy
import time

import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
from common import median_ms, write


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, width=1024, depth=4):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _timed_backward(ddp, x, y):
    """(backward ms, first bucket launch as a fraction of backward, gradients)."""
    first = []
    hook = ddp.reducer.hook

    def timing_hook(bucket):
        if not first:
            first.append(time.perf_counter())
        return hook(bucket)
    ddp.reducer.hook = timing_hook
    timing_hook.divisor = hook.divisor
    for p in ddp.parameters():
        p.grad = None
    loss = F.mse_loss(ddp(x), y)
    ddp._comm.Barrier()
    start = time.perf_counter()
    loss.backward()
    end = time.perf_counter()
    ddp.reducer.hook = hook
    return (end - start), (first[0] - start) / (end - start), \
        [p.grad.clone() for p in ddp.parameters()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = hpcddp.init()
    torch.manual_seed(0)
    base = Stack()
    whole = copy.deepcopy(base)
    per_block = copy.deepcopy(base)
    for block in per_block.blocks:
        block.compile()
    variants = {
        "eager": hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=2),
        "compiled_whole": hpcddp.DistributedDataParallel(torch.compile(whole), bucket_cap_mb=2),
        "compiled_per_block": hpcddp.DistributedDataParallel(per_block, bucket_cap_mb=2),
    }
    g = torch.Generator().manual_seed(world.rank)
    x, y = torch.randn(256, 1024, generator=g), torch.randn(256, 1024, generator=g)
    for ddp in variants.values():
        for _ in range(3):
            _timed_backward(ddp, x, y)  # compiles, rebuilds buckets
    times = {k: [] for k in variants}
    fractions = {k: [] for k in variants}
    grads = {}
    for _ in range(args.steps):
        for key, ddp in variants.items():
            seconds, fraction, grads[key] = _timed_backward(ddp, x, y)
            times[key].append(seconds)
            fractions[key].append(fraction)
    result = {key: {"backward_ms": median_ms(times[key]),
                    "first_launch_fraction_of_backward": float(torch.tensor(fractions[key]).median()),
                    "max_grad_diff_vs_eager": max(float((a - b).abs().max())
                                                  for a, b in zip(grads[key], grads["eager"]))}
              for key in variants}
    if world.is_main:
        for key, row in result.items():
            print(f"  {key:20} backward {row['backward_ms']:7.2f} ms, first launch at "
                  f"{row['first_launch_fraction_of_backward'] * 100:5.1f} % of backward, "
                  f"max |grad - eager| {row['max_grad_diff_vs_eager']:.2e}")
    path = write("compile", {"benchmark": "first bucket launch under torch.compile",
                             "steps": args.steps, "torch": torch.__version__,
                             "results": result}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
