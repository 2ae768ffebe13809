"""The memory DDP adds per rank, hpcddp against torch's DDP on gloo, with and without
``gradient_as_bucket_view``; and the memory a checkpoint load adds, hpcddp's against
``torch.load`` plus ``load_state_dict``.

Run: ``python benchmarks/bench_memory.py`` (it starts one ``mpiexec -n 2`` job per case,
so that each peak is the case's own), or ``--device cuda`` on a GPU machine with
``--launcher "mpirun ..."``.

Each DDP job builds a 100M-parameter MLP (six 4096 x 4096 layers), measures the memory
after that, wraps it (or not: the bare model is the baseline), and runs three SGD steps
on a batch of 16, ``zero_grad`` between them as a training loop does. The peak is the
process's high-water mark of resident memory on the CPU (``VmHWM``) and torch's
``max_memory_allocated`` on a GPU; what a case adds is its peak less the baseline
model's memory, and what DDP adds is that less the bare model's step. Two layouts:
hpcddp's default, where a parameter of at least 1 MiB is reduced in its own gradient,
and ``HPCDDP_SOLO_BUCKET_KB=0``, where every gradient is copied into buckets as torch's
reducer does. The figure is the largest over the ranks.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
DDP_CASES = ("bare", "torch_ddp", "torch_ddp_bucket_view", "hpcddp", "hpcddp_bucket_view")
LAYOUTS = {"default": {}, "buckets_only": {"HPCDDP_SOLO_BUCKET_KB": "0"}}


# -- one job ----------------------------------------------------------------------------------

def _resident(field: str) -> int:
    """``VmHWM`` (the peak) or ``VmRSS`` (now) of this process, in bytes."""
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields[field].split()[0]) * 1024


class _Meter:
    """Memory now and at peak: resident memory on the CPU, torch's allocator on a GPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def now(self) -> int:
        import torch
        return torch.cuda.memory_allocated() if self.cuda else _resident("VmRSS")

    def reset_peak(self) -> None:
        import torch
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        import torch
        return torch.cuda.max_memory_allocated() if self.cuda else _resident("VmHWM")


def _mlp(device):
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(6)]).to(device)


def ddp_job(case: str, device_kind: str) -> dict:
    import torch
    from mpi4py import MPI
    import hpcddp
    from common import make_gloo_group
    world = hpcddp.init()
    device = world.device if device_kind == "cuda" else torch.device("cpu")
    gloo = make_gloo_group(world)[0] if case.startswith("torch") else None
    meter = _Meter(device)
    model = _mlp(device)
    inputs = torch.randn(16, 4096, device=device)
    if meter.cuda:
        torch.cuda.synchronize()
    base = meter.now()
    meter.reset_peak()
    view = case.endswith("bucket_view")
    if case.startswith("torch"):
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model, process_group=gloo, gradient_as_bucket_view=view)
    elif case.startswith("hpcddp"):
        wrapped = hpcddp.DistributedDataParallel(model, gradient_as_bucket_view=view)
    else:
        wrapped = model
    wrap = meter.now() - base
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    for _ in range(3):
        optimizer.zero_grad()
        wrapped(inputs).square().mean().backward()
        optimizer.step()
    if meter.cuda:
        torch.cuda.synchronize()
    added = world.comm.allreduce(meter.peak() - base, op=MPI.MAX)
    wrap = world.comm.allreduce(wrap, op=MPI.MAX)
    return {"case": case, "added_mib": added / MIB, "at_wrap_mib": wrap / MIB}


def checkpoint_job(case: str, device_kind: str, directory: str) -> dict:
    """Save the MLP with SGD momentum once (a job of its own), or load it: hpcddp's load,
    or ``torch.load`` of the same file and ``load_state_dict``."""
    import torch
    from mpi4py import MPI
    import hpcddp
    import hpcddp.checkpoint as checkpoint
    world = hpcddp.init()
    device = world.device if device_kind == "cuda" else torch.device("cpu")
    model = _mlp(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    model(torch.randn(16, 4096, device=device)).square().mean().backward()
    optimizer.step()  # momentum buffers exist: they are saved and loaded
    optimizer.zero_grad(set_to_none=True)
    meter = _Meter(device)
    if case == "save":
        checkpoint.save(directory, model, optimizer, step=1)
        return {"case": case}
    if meter.cuda:
        torch.cuda.synchronize()
    base = meter.now()
    meter.reset_peak()
    if case == "hpcddp_load":
        checkpoint.load(directory, model, optimizer, check_writable=False)
    else:
        state = torch.load(next(Path(directory).glob("step-*/state.pt")), map_location=device,
                           weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        del state
    if meter.cuda:
        torch.cuda.synchronize()
    added = world.comm.allreduce(meter.peak() - base, op=MPI.MAX)
    return {"case": case, "added_mib": added / MIB}


# -- the driver -------------------------------------------------------------------------------

def _run_job(launcher, ranks, args, env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", HPCDDP_NUM_THREADS="1", **env_extra)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE)] + [p for p in [env.get("PYTHONPATH")] if p])
    command = shlex.split(launcher) + [str(ranks), sys.executable, str(Path(__file__).resolve()),
                                       *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        sys.exit(f"bench_memory: {' '.join(args)} failed (exit {done.returncode}):\n"
                 f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--launcher", default=f"{Path(sys.executable).parent / 'mpiexec'} -n",
                        help="the command that starts N ranks, N appended (default: mpiexec -n)")
    parser.add_argument("--out", default=None, help="default results/memory[_cuda].json")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, case, *rest = args.worker
        result = (ddp_job(case, args.device) if kind == "ddp"
                  else checkpoint_job(case, args.device, *rest))
        if int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))) == 0:
            print(json.dumps(result), flush=True)
        return

    def job(*worker, env=None):
        return _run_job(args.launcher, args.ranks, ["--device", args.device, "--worker", *worker],
                        env or {})

    layouts = {}
    for layout, env in LAYOUTS.items():
        cases = {case: job("ddp", case, env=env) for case in DDP_CASES}
        bare = cases["bare"]["added_mib"]
        ddp_added = {case: cases[case]["added_mib"] - bare for case in DDP_CASES[1:]}
        layouts[layout] = {
            "env": env, "cases": cases, "ddp_added_mib": ddp_added,
            "hpcddp_vs_torch": ddp_added["hpcddp"] / ddp_added["torch_ddp"],
            "hpcddp_bucket_view_vs_torch": (ddp_added["hpcddp_bucket_view"]
                                            / ddp_added["torch_ddp_bucket_view"]),
        }
        print(f"{layout}: DDP adds hpcddp {ddp_added['hpcddp']:.0f} MiB, torch "
              f"{ddp_added['torch_ddp']:.0f}; with the bucket view hpcddp "
              f"{ddp_added['hpcddp_bucket_view']:.0f}, torch "
              f"{ddp_added['torch_ddp_bucket_view']:.0f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as directory:
        job("checkpoint", "save", directory)
        loads = {case: job("checkpoint", case, directory)
                 for case in ("hpcddp_load", "torch_load")}
        state_mib = sum(p.stat().st_size for p in Path(directory).rglob("*")
                        if p.is_file()) / MIB
    print(f"checkpoint of {state_mib:.0f} MiB: load adds hpcddp "
          f"{loads['hpcddp_load']['added_mib']:.0f} MiB, torch.load + load_state_dict "
          f"{loads['torch_load']['added_mib']:.0f}", flush=True)

    import torch
    from common import machine  # after the jobs: it loads MPI in this process
    result = {
        "benchmark": "memory DDP and a checkpoint load add per rank",
        "device": args.device, "ranks": args.ranks, "model": "MLP 6 x Linear(4096, 4096), "
        "100.7M parameters, fp32; 3 SGD steps on a batch of 16",
        "measure": "max_memory_allocated (cuda)" if args.device == "cuda"
                   else "VmHWM less the resident memory after the model was made",
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "layouts": layouts,
        "checkpoint": {"state_mib": state_mib, "cases": loads,
                       "hpcddp_vs_torch": (loads["hpcddp_load"]["added_mib"]
                                           / loads["torch_load"]["added_mib"])},
        "machine": machine(),
    }
    out = Path(args.out) if args.out else \
        HERE / "results" / ("memory_cuda.json" if args.device == "cuda" else "memory.json")
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
