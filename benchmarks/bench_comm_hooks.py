"""Gradient compression: hpcddp's in-transport fp16/bf16 against torch's
``fp16_compress_hook`` on hpcddp's group and on torch's DDP over gloo, and PowerSGD on
hpcddp; interleaved in one job, on the MLP of ``bench_ddp.py`` (24 MiB of gradients).

Run: ``mpiexec -n 2 python benchmarks/bench_comm_hooks.py`` (1 torch thread per rank).
"""

import argparse
import copy

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
from bench_ddp import MODELS, _stepper
from common import make_gloo_group, median_ms, timed, write


def _hooked(base, state, hook, gloo=None):
    if gloo is None:
        ddp = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    else:
        ddp = TorchDDP(copy.deepcopy(base), process_group=gloo, bucket_cap_mb=25)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return _stepper(ddp)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--model", default="mlp")
    args = parser.parse_args()
    torch.set_num_threads(1)
    world = hpcddp.init()
    gloo, _backend, _store = make_gloo_group(world)
    make, data = MODELS[args.model]
    torch.manual_seed(0)
    base = make()
    variants = {
        "torch_ddp_gloo": _hooked(base, None, None, gloo),
        "torch_ddp_gloo_fp16_hook": _hooked(base, gloo, default_hooks.fp16_compress_hook, gloo),
        "no_communication": _stepper(copy.deepcopy(base)),
        "hpcddp": _hooked(base, None, None),
        "hpcddp_torch_fp16_hook": _hooked(base, None, default_hooks.fp16_compress_hook),
        "hpcddp_fp16": _hooked(base, None, hpcddp.fp16_compress_hook),
        "hpcddp_bf16": _hooked(base, None, hpcddp.bf16_compress_hook),
        "hpcddp_powerSGD_rank4": _hooked(
            base, psgd.PowerSGDState(None, matrix_approximation_rank=4, start_powerSGD_iter=2,
                                     min_compression_rate=2), psgd.powerSGD_hook),
    }
    x, y = data()
    for fn in variants.values():
        for _ in range(4):
            fn(x, y)  # warm-up: bucket rebuild, PowerSGD past its start
    samples = {k: [] for k in variants}
    for _ in range(args.steps):
        for key, fn in variants.items():
            samples[key].append(timed(world.comm, lambda: fn(x, y)))
    ms = {k: median_ms(v) for k, v in samples.items()}
    ratios = {
        "hpcddp_fp16_vs_torch_fp16_hook_on_gloo": ms["hpcddp_fp16"] / ms["torch_ddp_gloo_fp16_hook"],
        "hpcddp_fp16_vs_torch_fp16_hook_on_hpcddp": ms["hpcddp_fp16"] / ms["hpcddp_torch_fp16_hook"],
        "hpcddp_torch_fp16_hook_vs_gloo": ms["hpcddp_torch_fp16_hook"] / ms["torch_ddp_gloo_fp16_hook"],
        "hpcddp_vs_torch_ddp": ms["hpcddp"] / ms["torch_ddp_gloo"],
    }
    if world.is_main:
        print(f"\n{args.model}, median of {args.steps} steps, {world.size} ranks")
        for key, value in ms.items():
            print(f"  {key:28} {value:8.2f} ms")
        for key, value in ratios.items():
            print(f"  {key:44} {value:.2f}")
    path = write("comm_hooks", {"benchmark": "DDP step with gradient compression hooks",
                                "model": args.model, "steps": args.steps,
                                "threads_per_rank": torch.get_num_threads(),
                                "step_ms": ms, "ratios": ratios}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
