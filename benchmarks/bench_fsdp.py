"""FSDP2 on the hpcddp backend against FSDP2 on torch's gloo, in one job.

One training step (forward, backward, optimizer) of a stack of MLP blocks sharded with
``fully_shard`` per block, on a device mesh over hpcddp's default group and on one over
gloo, interleaved; and the two collectives FSDP2 lives on, ``all_gather_into_tensor``
from the rank's own chunk (in place) and ``reduce_scatter_tensor``, on each backend.
Writes ``results/fsdp-<N>ranks.json``: medians, and hpcddp's time over gloo's (below 1: faster).

    mpiexec -n 2 python benchmarks/bench_fsdp.py
"""

import argparse
import copy

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard

import hpcddp
from common import interleaved_ms, make_gloo_group, write


def _model(width, depth):
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(),
                                         nn.Linear(2 * width, width))
                           for _ in range(depth)])


def _fsdp_step(base, mesh, batch):
    model = copy.deepcopy(base)
    for block in model:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step():
        opt.zero_grad()
        model(batch).square().mean().backward()
        opt.step()
    return step


def _collectives(world, group, mib):
    n = mib * 2 ** 20 // 4 // world.size * world.size
    out = torch.randn(n)
    chunk = out[world.rank * n // world.size:(world.rank + 1) * n // world.size]
    full, part = torch.randn(n), torch.empty(n // world.size)
    return (lambda: dist.all_gather_into_tensor(out, chunk, group=group),
            lambda: dist.reduce_scatter_tensor(part, full, group=group))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--mib", type=int, default=32, help="collective size")
    parser.add_argument("--iters", type=int, default=15)
    args = parser.parse_args()
    world = hpcddp.init()
    gloo, _backend, _store = make_gloo_group(world)
    ours = init_device_mesh("cpu", (world.size,))
    theirs = DeviceMesh.from_group(gloo, "cpu")
    base = _model(args.width, args.depth)
    batch = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(world.rank))
    ag_ours, rs_ours = _collectives(world, None, args.mib)
    ag_gloo, rs_gloo = _collectives(world, gloo, args.mib)
    ms = interleaved_ms(world.comm, {
        "fsdp2_step_hpcddp": _fsdp_step(base, ours, batch),
        "fsdp2_step_gloo": _fsdp_step(base, theirs, batch),
        "all_gather_in_place_hpcddp": ag_ours, "all_gather_in_place_gloo": ag_gloo,
        "reduce_scatter_hpcddp": rs_ours, "reduce_scatter_gloo": rs_gloo,
    }, args.iters)
    ratios = {f"{what}_hpcddp_vs_gloo": ms[f"{what}_hpcddp_ms"] / ms[f"{what}_gloo_ms"]
              for what in ("fsdp2_step", "all_gather_in_place", "reduce_scatter")}
    params = sum(p.numel() for p in base.parameters())
    payload = {"model": {"width": args.width, "depth": args.depth, "batch": args.batch,
                         "parameters": params, "mib": params * 4 / 2 ** 20},
               "collective_mib": args.mib, "iters": args.iters, "ms": ms, "ratios": ratios}
    path = write(f"fsdp-{world.size}ranks", payload, world)
    if world.is_main:
        for name, value in {**ms, **ratios}.items():
            print(f"{name:40s} {value:9.3f}")
        print(f"wrote {path}")
    hpcddp.shutdown()


if __name__ == "__main__":
    main()
