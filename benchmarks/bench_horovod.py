"""A Horovod program's training step on hpcddp.horovod (``hvd.DistributedOptimizer``)
against the same model under hpcddp's DDP, torch's DDP on gloo, no communication, and
one raw MPI allreduce of all gradient bytes; and one small ``hvd.allreduce`` against a
raw MPI allreduce of the same float (what the engine's negotiation by name costs).
Interleaved in one job.

The models (``--models``): the MLP (24 MiB of gradients in 12 tensors), a ResNet-18-shaped
CNN at a quarter of its width (``resnet_cifar``, 2.7 MiB in 62 tensors, the shape of
Horovod's synthetic benchmark without torchvision) and the tutorials' ToyModel (0.2 MiB).

Run: ``mpiexec -n 2 python benchmarks/bench_horovod.py`` (1 torch thread per rank).
``HOROVOD_FUSION_THRESHOLD`` applies as in a Horovod job.
"""

import argparse
import copy

import numpy as np
import torch
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
import hpcddp.horovod as hvd
from bench_ddp import MODELS, _loss, _stepper
from common import make_gloo_group, median_ms, timed, write


def _horovod_stepper(model, **kwargs):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-4),
                                   named_parameters=model.named_parameters(), **kwargs)

    def step(x, y):
        opt.zero_grad()
        _loss(model(x), y).backward()
        opt.step()
    return step


def bench_model(name, world, gloo, steps):
    make, data = MODELS[name]
    torch.manual_seed(0)
    base = make()
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    flat = np.ones(grad_bytes // 4, dtype=np.float32)
    variants = {
        "no_communication": _stepper(copy.deepcopy(base)),
        "torch_ddp_gloo": _stepper(TorchDDP(copy.deepcopy(base), process_group=gloo,
                                            bucket_cap_mb=25)),
        "hpcddp_ddp": _stepper(hpcddp.DistributedDataParallel(copy.deepcopy(base),
                                                              bucket_cap_mb=25)),
        "horovod": _horovod_stepper(copy.deepcopy(base)),
        "horovod_fp16": _horovod_stepper(copy.deepcopy(base),
                                         compression=hvd.Compression.fp16),
    }
    samples = {k: [] for k in variants}
    samples["raw_allreduce"] = []
    x, y = data()
    for fn in variants.values():
        for _ in range(3):
            fn(x, y)
    for _ in range(steps):
        for key, fn in variants.items():
            samples[key].append(timed(world.comm, lambda: fn(x, y)))
        samples["raw_allreduce"].append(
            timed(world.comm, lambda: MPI.Intracomm.Allreduce(world.comm, MPI.IN_PLACE, flat)))
    ms = {k: median_ms(v) for k, v in samples.items()}
    exposed = {k: ms[k] - ms["no_communication"] for k in variants if k != "no_communication"}
    result = {"model": name, "grad_bytes": grad_bytes, "step_ms": ms, "exposed_comm_ms": exposed,
              "horovod_vs_hpcddp_ddp": ms["horovod"] / ms["hpcddp_ddp"],
              "horovod_vs_torch_ddp_gloo": ms["horovod"] / ms["torch_ddp_gloo"],
              "horovod_exposed_vs_raw_allreduce": exposed["horovod"] / ms["raw_allreduce"]}
    if world.is_main:
        print(f"\n{name}: {grad_bytes / 2**20:.1f} MiB of gradients, median of {steps} steps")
        for key in ms:
            extra = f"  exposed {exposed[key]:7.2f} ms" if key in exposed else ""
            print(f"  {key:20} {ms[key]:8.2f} ms{extra}")
        print(f"  horovod / hpcddp DDP: {result['horovod_vs_hpcddp_ddp']:.2f}   horovod / "
              f"torch DDP: {result['horovod_vs_torch_ddp_gloo']:.2f}", flush=True)
    return result


def small_allreduce(world, iters):
    """One float through the engine (named, negotiated, fused, issued) and through MPI."""
    one = torch.ones(1)
    raw = np.ones(1, dtype=np.float32)
    runs = {"hvd_allreduce": lambda: hvd.allreduce(one, op=hvd.Sum),
            "mpi_allreduce": lambda: MPI.Intracomm.Allreduce(world.comm, MPI.IN_PLACE, raw)}
    samples = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(iters):
        for key, fn in runs.items():
            samples[key].append(timed(world.comm, fn))
    us = {k: float(np.median(v) * 1e6) for k, v in samples.items()}
    if world.is_main:
        print(f"\none float: hvd.allreduce {us['hvd_allreduce']:.0f} us, MPI allreduce "
              f"{us['mpi_allreduce']:.0f} us", flush=True)
    return {"median_us": us, "hvd_vs_mpi": us["hvd_allreduce"] / us["mpi_allreduce"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--models", default="mlp,resnet_cifar,toy_cifar")
    parser.add_argument("--name", default="horovod", help="results/<name>.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = hpcddp.init()
    hvd.init()
    gloo, _backend, _store = make_gloo_group(world)
    results = [bench_model(m, world, gloo, args.steps) for m in args.models.split(",")]
    small = small_allreduce(world, 200)
    path = write(args.name, {"benchmark": "a Horovod program's training step",
                             "steps": args.steps, "threads_per_rank": torch.get_num_threads(),
                             "results": results, "one_float_allreduce": small}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
