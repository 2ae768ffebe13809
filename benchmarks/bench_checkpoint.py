"""Checkpoint save and load against plain torch.save + fsync and torch.load.

Setups: bench_ddp's 24 MB MLP with Adam (72 MiB of state); a 72 MiB MLP with SGD and
momentum (144 MiB); the 72 MiB model alone. Both sides keep the last 2: a new file per
save, the older one removed.

Run: ``mpiexec -n 2 python benchmarks/bench_checkpoint.py [--dir /tmp]``. Interleaved,
median of ``--repeats`` with the spread (min, max); each figure is the slowest rank's time.

Peers: ``torch.save`` + fsync on rank 0; ``torch.load`` of the file on every rank (what a
torch script does to resume) and on rank 0 alone, and on every rank the same followed by
the model's and the optimizer's ``load_state_dict`` (which hpcddp's load includes). Also
the checksums a corruption check could use, each on the state's bytes in memory (blake3
and crc32c with the ``bench`` extra installed).
"""

import argparse
import hashlib
import os
import shutil
import time

import numpy as np
import torch
import xxhash
from mpi4py import MPI
from torch import nn

import hpcddp
import hpcddp.checkpoint as checkpoint
from hpcddp.checkpoint import store
from common import write


SETUPS = {
    # The state of the round-two table: bench_ddp's 24 MB MLP with Adam (72 MiB).
    "mlp24_adam": (1024, "adam"),
    # A 72 MiB MLP with SGD and momentum (144 MiB of state), and the same model alone.
    "mlp72_sgd_momentum": (1776, "sgd"),
    "mlp72_model_alone": (1776, None),
}


def bench_setup(world, name, args):
    width, optimizer = SETUPS[name]
    layers = []
    for _ in range(6):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = hpcddp.DistributedDataParallel(nn.Sequential(*layers[:-1]))
    opt = (torch.optim.Adam(model.parameters()) if optimizer == "adam" else
           torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if optimizer else None)
    model(torch.randn(8, width)).sum().backward()
    if opt is not None:
        opt.step()
    root = os.path.join(args.dir, f"hpcddp-bench-ckpt-{os.getpid() if world.is_main else 0}")
    root = world.comm.bcast(root, root=0)
    state = {"model": model.module.state_dict()}
    if opt is not None:
        state["optimizer"] = opt.state_dict()
    counter = {"saves": 0}

    def torch_save():
        # As hpcddp's keep_last=2: a new file per save, the one before the last removed.
        if world.is_main:
            counter["saves"] += 1
            with open(f"{root}-plain-{counter['saves']}.pt", "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            stale = f"{root}-plain-{counter['saves'] - 2}.pt"
            if os.path.exists(stale):
                os.remove(stale)

    def plain():
        return f"{root}-plain-{counter['saves']}.pt"

    def torch_load():
        return torch.load(world.comm.bcast(plain() if world.is_main else None), weights_only=True)

    def torch_load_one_rank():  # the file read by rank 0 alone, as the first round measured
        if world.is_main:
            torch.load(plain(), weights_only=True)

    def torch_load_and_apply():
        loaded = torch_load()
        model.module.load_state_dict(loaded["model"])
        if opt is not None:
            opt.load_state_dict(loaded["optimizer"])

    steps = iter(range(1, 1 << 30))
    runs = {"hpcddp_save": lambda: checkpoint.save(root, model, opt, step=next(steps),
                                                   keep_last=2),
            "torch_save_fsync": torch_save,
            "hpcddp_load": lambda: checkpoint.load(root, model, opt),
            "torch_load": torch_load,
            "torch_load_one_rank": torch_load_one_rank,
            "torch_load_and_apply": torch_load_and_apply}
    times = {k: [] for k in runs}
    for fn in runs.values():
        fn()
    for _ in range(args.repeats):
        for key, fn in runs.items():
            world.comm.Barrier()
            start = time.perf_counter()
            fn()
            times[key].append(world.comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
            # The save deletes the checkpoint it no longer keeps in a background thread;
            # it finishes here, untimed, so that it never slows the next measurement.
            store.finish_removal()
    ms = {k: float(np.median(v) * 1e3) for k, v in times.items()}
    spread = {k: [float(min(v) * 1e3), float(max(v) * 1e3)] for k, v in times.items()}
    size = os.path.getsize(plain()) if world.is_main else 0
    result = {"setup": name, "state_bytes": world.comm.bcast(size), "ms": ms,
              "ms_min_max": spread,
              "save_vs_torch": ms["hpcddp_save"] / ms["torch_save_fsync"],
              "load_vs_torch_load": ms["hpcddp_load"] / ms["torch_load"],
              "load_vs_torch_load_one_rank": ms["hpcddp_load"] / ms["torch_load_one_rank"],
              "load_vs_torch_load_and_apply": ms["hpcddp_load"] / ms["torch_load_and_apply"]}
    if world.is_main:
        result["checksum_GiBps"] = _checksums(plain(), args.repeats)
        print({k: v for k, v in result.items() if k != "checksum_GiBps"}, flush=True)
        shutil.rmtree(root, ignore_errors=True)
        for k in range(counter["saves"] - 1, counter["saves"] + 1):
            if os.path.exists(f"{root}-plain-{k}.pt"):
                os.remove(f"{root}-plain-{k}.pt")
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--setups", default=",".join(SETUPS))
    args = parser.parse_args()
    world = hpcddp.init()
    results = [bench_setup(world, name, args) for name in args.setups.split(",")]
    write("checkpoint", {"benchmark": "checkpoint save/load against torch.save + fsync and "
                                      "torch.load; both keep the last 2 saves",
                         "results": results}, world)


def _checksums(path, repeats):
    """GiB/s of each checksum over the state's bytes, already in memory (median)."""
    with open(path, "rb") as f:
        data = f.read()
    candidates = {"sha256": lambda: hashlib.sha256(data).hexdigest(),
                  "xxh3_128": lambda: xxhash.xxh3_128(data).hexdigest()}
    try:
        import blake3
        candidates["blake3"] = lambda: blake3.blake3(data).hexdigest()
        candidates["blake3_threads"] = lambda: blake3.blake3(
            data, max_threads=blake3.blake3.AUTO).hexdigest()
    except ImportError:
        pass
    try:
        import crc32c
        candidates["crc32c"] = lambda: crc32c.crc32c(data)
    except ImportError:
        pass
    speeds = {}
    for name, run in candidates.items():
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - start)
        speeds[name] = len(data) / float(np.median(seconds)) / 2**30
    return speeds


if __name__ == "__main__":
    main()
