"""hpcddp.DistributedDataParallel against torch's DDP on gloo, no communication, and one
raw MPI allreduce of all gradient bytes (mpi4py's blocking call, past hpcddp's lock);
interleaved in one job.

Run: ``mpiexec -n 2 python benchmarks/bench_ddp.py`` (1 torch thread per rank), or with
``--device cuda`` on a GPU machine, where "no_communication" is the bare ``torch.cuda``
step and hpcddp goes through device buffers (CUDA-aware MPI) or pinned staging.
"""

import argparse
import copy
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI
from torch import nn
from torch.nn.parallel import DistributedDataParallel as TorchDDP

import hpcddp
from hpcddp import timeline
from hpcddp.timeline.profiler import start_timeline
from common import make_gloo_group, median_ms, timed, write


class ToyModel(nn.Module):
    """The CIFAR-10 model of the DDP tutorials."""

    def __init__(self):
        super().__init__()
        self.conv1, self.pool = nn.Conv2d(3, 6, 5), nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1, self.fc2, self.fc3 = nn.Linear(400, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x))).flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


class _Block(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm, and the shortcut."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.short(x))


def resnet_cifar():
    """A ResNet-18-shaped network at a quarter of its width (torchvision-free), for
    32x32 images: 0.7 M parameters in 62 tensors."""
    layers, cin = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()], 16
    for cout, stride in ((16, 1), (32, 2), (64, 2), (128, 2)):
        layers += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
    return nn.Sequential(*layers)


def mlp():
    layers = []
    for _ in range(6):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


MODELS = {
    "mlp": (mlp, lambda: (torch.randn(64, 1024), torch.randn(64, 1024))),
    # The same gradients behind 16 times the compute: what a GPU step looks like.
    "mlp_b1024": (mlp, lambda: (torch.randn(1024, 1024), torch.randn(1024, 1024))),
    "resnet_cifar": (resnet_cifar, lambda: (torch.randn(16, 3, 32, 32),
                                            torch.randint(0, 10, (16,)))),
    "toy_cifar": (ToyModel, lambda: (torch.randn(16, 3, 32, 32), torch.randint(0, 10, (16,)))),
}


def _loss(out, y):
    return F.cross_entropy(out, y) if y.dtype == torch.long else F.mse_loss(out, y)


def _stepper(model):
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step(x, y):
        opt.zero_grad()
        _loss(model(x), y).backward()
        opt.step()
    return step


def thread_cpu_seconds(name: str) -> float:
    """CPU seconds this process's thread ``name`` has used so far (Linux ``/proc``), 0
    where there is no such thread."""
    for thread in threading.enumerate():
        if thread.name == name and thread.native_id:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()  # after the name, which may hold spaces
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return 0.0


def _traced(recorder, step):
    """``step`` while ``recorder`` records (HPCDDP_TIMELINE), and only then."""
    def traced(x, y):
        timeline._recorder = recorder
        try:
            step(x, y)
        finally:
            timeline._recorder = None
    return traced


def span_off_ns(repeats=200_000):
    """What one span costs with no timeline and no torch.profiler: the price of the
    instrumentation when it is off."""
    start = time.perf_counter()
    for _ in range(repeats):
        with timeline.span("bench", timeline.REDUCER):
            pass
    return (time.perf_counter() - start) / repeats * 1e9


def bookkeeping_us(repeats=200_000):
    """What the watchdog's bookkeeping adds to one collective: counting it and entering
    and leaving its wait (the main thread's only work for the watchdog)."""
    from hpcddp.comm import activity
    channel = activity.Channel("bench", (0,))
    start = time.perf_counter()
    for _ in range(repeats):
        with activity.waiting("bench", channel, channel.issue("bench")):
            pass
    return (time.perf_counter() - start) / repeats * 1e6


def gradient_memory(ddp):
    """Bytes held for gradients: bucket buffers plus .grad tensors living outside them
    (a solo bucket that never needed a buffer of its own holds none)."""
    buckets = {b.owned.untyped_storage().data_ptr(): b.owned.untyped_storage().nbytes()
               for b in ddp.reducer.buckets if b.owned is not None}
    outside = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
               for p in ddp.parameters() if p.grad is not None}
    outside = {k: v for k, v in outside.items() if k not in buckets}
    return sum(buckets.values()) + sum(outside.values())


def bench_model(name, world, gloo, steps, caps, device):
    make, data = MODELS[name]
    torch.manual_seed(0)
    base = make().to(device)
    grad_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    flat = np.ones(grad_bytes // 4, dtype=np.float32)
    variants = {
        "torch_ddp_gloo": _stepper(TorchDDP(copy.deepcopy(base), process_group=gloo,
                                            bucket_cap_mb=25)),
        "no_communication": _stepper(copy.deepcopy(base)),
    }
    plain = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    viewed = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25,
                                            gradient_as_bucket_view=True)
    variants["hpcddp"] = _stepper(plain)
    variants["hpcddp_bucket_view"] = _stepper(viewed)
    # HPCDDP_SOLO_BUCKET_KB=0: large host parameters copied into buckets, as in torch.
    os.environ["HPCDDP_SOLO_BUCKET_KB"] = "0"
    bucketed = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    del os.environ["HPCDDP_SOLO_BUCKET_KB"]
    variants["hpcddp_no_solo"] = _stepper(bucketed)
    for cap in caps:
        variants[f"hpcddp_cap{cap:g}"] = _stepper(
            hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=cap))
    if device.type == "cuda" and not world.cuda_aware:
        whole = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
        whole.reducer.transport.chunk_bytes = 0  # as HPCDDP_STAGING_CHUNK_KB=0
        variants["hpcddp_staged_whole"] = _stepper(whole)
    # hpcddp's ring of point-to-point instead of MPI's Iallreduce (HPCDDP_REDUCE=ring).
    ringed = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    ringed.reducer.transport.use_reduction("ring")
    variants["hpcddp_ring"] = _stepper(ringed)
    threaded = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    threaded.reducer.progress_thread = True
    variants["hpcddp_progress_thread"] = _stepper(threaded)
    # HPCDDP_DEBUG=detail: every bucket's allreduce is compared across ranks first.
    os.environ["HPCDDP_DEBUG"] = "detail"
    checked = hpcddp.DistributedDataParallel(copy.deepcopy(base), bucket_cap_mb=25)
    del os.environ["HPCDDP_DEBUG"]
    variants["hpcddp_debug_detail"] = _stepper(checked)
    # The same model as "hpcddp" recording a timeline (HPCDDP_TIMELINE) in its steps.
    recorder = start_timeline(f"/tmp/hpcddp-bench-timeline-{name}.json", world.comm)
    timeline._recorder = None  # on in that variant's steps only
    variants["hpcddp_timeline"] = _traced(recorder, _stepper(plain))
    samples = {k: [] for k in variants}
    samples["raw_allreduce"] = []
    x, y = (t.to(device) for t in data())
    for fn in variants.values():
        for _ in range(3):
            fn(x, y)  # warm-up, includes the bucket rebuild
    threads = {name: -thread_cpu_seconds(name) for name in ("hpcddp-watchdog", "hpcddp-mpi")}
    began = time.perf_counter()
    for _ in range(steps):
        for key, fn in variants.items():
            samples[key].append(timed(world.comm, lambda: fn(x, y)))
        samples["raw_allreduce"].append(
            timed(world.comm, lambda: MPI.Intracomm.Allreduce(world.comm, MPI.IN_PLACE, flat)))
    seconds = time.perf_counter() - began
    # What the helper threads take of a core while every variant trains: the watchdog's
    # ticks, and the MPI thread's calls (the reductions' own work included).
    threads = {name: (used + thread_cpu_seconds(name)) / seconds
               for name, used in threads.items()}
    spans = len(recorder.events) / (steps + 3)
    recorder.close()
    ms = {k: median_ms(v) for k, v in samples.items()}
    memory = {"hpcddp": gradient_memory(plain), "hpcddp_bucket_view": gradient_memory(viewed),
              "hpcddp_no_solo": gradient_memory(bucketed),
              "hpcddp_pinned_staging": plain.reducer.transport.staged.staged_bytes}
    exposed = {k: ms[k] - ms["no_communication"] for k in ms if k.startswith(("hpcddp", "torch"))}
    result = {
        "model": name, "grad_bytes": grad_bytes, "step_ms": ms, "exposed_comm_ms": exposed,
        "gradient_memory_bytes": memory,
        "hpcddp_vs_torch_ddp": ms["hpcddp"] / ms["torch_ddp_gloo"],
        "hpcddp_ring_vs_torch_ddp": ms["hpcddp_ring"] / ms["torch_ddp_gloo"],
        "hpcddp_exposed_vs_raw_allreduce": exposed["hpcddp"] / ms["raw_allreduce"],
        "thread_cpu_share": threads,
        "debug_detail_cost": ms["hpcddp_debug_detail"] / ms["hpcddp"] - 1,
        "timeline_cost": ms["hpcddp_timeline"] / ms["hpcddp"] - 1,
        "timeline_spans_per_step": spans,
        "collectives_per_step": plain.reducer.transport.channel.count / (2 * (steps + 3)),
    }
    if world.is_main:
        print(f"\n{name}: {grad_bytes / 2**20:.1f} MiB of gradients, median of {steps} steps")
        for key in ms:
            extra = f"  exposed {exposed[key]:7.2f} ms" if key in exposed else ""
            print(f"  {key:24} {ms[key]:8.2f} ms{extra}")
        print(f"  gradient memory: {memory['hpcddp'] / 2**20:.1f} MiB, with "
              f"gradient_as_bucket_view {memory['hpcddp_bucket_view'] / 2**20:.1f} MiB; "
              f"pinned staging {memory['hpcddp_pinned_staging'] / 2**20:.1f} MiB")
        print(f"  watchdog thread: {threads['hpcddp-watchdog']:.3%} of a core, MPI thread "
              f"{threads['hpcddp-mpi']:.1%}; "
              f"HPCDDP_DEBUG=detail: {result['debug_detail_cost']:+.2%}; timeline "
              f"({spans:.0f} spans a step): {result['timeline_cost']:+.2%}")
        print(f"  hpcddp / torch DDP: {result['hpcddp_vs_torch_ddp']:.2f}   "
              f"hpcddp exposed / raw allreduce: {result['hpcddp_exposed_vs_raw_allreduce']:.2f}",
              flush=True)
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--models", default=None,
                        help="comma-separated; default mlp,toy_cifar (cpu), plus mlp_b1024 (cuda)")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for this rank's GPU")
    parser.add_argument("--name", default=None,
                        help="results/<name>.json (default ddp, or ddp_cuda on a GPU)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_ddp --device cuda: torch sees no CUDA device here")
    world = hpcddp.init()
    gloo, _backend, _store = make_gloo_group(world)
    device = world.device if args.device == "cuda" else torch.device("cpu")
    models = args.models or ("mlp,toy_cifar" if device.type == "cpu"
                             else "mlp,mlp_b1024,toy_cifar")
    results = [bench_model(m, world, gloo, args.steps, caps=(1, 5, 100), device=device)
               for m in models.split(",")]
    name = args.name or ("ddp" if device.type == "cpu" else "ddp_cuda")
    path = write(name, {"benchmark": "DDP training step", "device": str(device),
                        "cuda_aware": world.cuda_aware,
                        "cuda_aware_reason": world.cuda_aware_reason,
                        "reduction": world.reduction,
                        "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None,
                        "steps": args.steps,
                        "threads_per_rank": torch.get_num_threads(),
                        "watchdog_bookkeeping_us_per_collective": bookkeeping_us(),
                        "timeline_off_ns_per_span": span_off_ns(),
                        "results": results}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
