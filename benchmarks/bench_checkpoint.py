"""Checkpoint save and load against plain torch.save + fsync and torch.load.

Run: ``mpiexec -n 2 python benchmarks/bench_checkpoint.py [--dir /tmp]``. The state is
the 24 MB MLP of the DDP benchmark with Adam (about 72 MiB). Interleaved, median of
``--repeats``; each figure is the slowest rank's time (the peers run on rank 0 alone,
which is all they do).
"""

import argparse
import hashlib
import os
import shutil
import time

import numpy as np
import torch
from mpi4py import MPI
from torch import nn

import hpcddp
import hpcddp.checkpoint as checkpoint
from common import write


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    world = hpcddp.init()
    layers = []
    for _ in range(6):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = hpcddp.DistributedDataParallel(nn.Sequential(*layers[:-1]))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 1024)).sum().backward()
    opt.step()
    root = os.path.join(args.dir, f"hpcddp-bench-ckpt-{os.getpid() if world.is_main else 0}")
    root = world.comm.bcast(root, root=0)
    plain = root + "-plain.pt"
    state = {"model": model.module.state_dict(), "optimizer": opt.state_dict()}

    def torch_save():
        if world.is_main:
            with open(plain, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

    def torch_load():
        if world.is_main:
            torch.load(plain, weights_only=True)

    def sha256_alone():
        if world.is_main:
            with open(plain, "rb") as f:
                hashlib.sha256(f.read()).hexdigest()

    def bcast_alone():
        size = world.comm.bcast(os.path.getsize(plain) if world.is_main else None)
        world.comm.Bcast(np.empty(size, np.uint8), root=0)

    runs = {"hpcddp_save": lambda: checkpoint.save(root, model, opt, step=1, keep_last=1),
            "torch_save_fsync": torch_save,
            "hpcddp_load": lambda: checkpoint.load(root, model, opt),
            "torch_load": torch_load,
            "part_sha256_of_state": sha256_alone, "part_bcast_of_state": bcast_alone}
    times = {k: [] for k in runs}
    torch_save()
    for fn in runs.values():
        fn()
    for _ in range(args.repeats):
        for key, fn in runs.items():
            world.comm.Barrier()
            start = time.perf_counter()
            fn()
            times[key].append(world.comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    ms = {k: float(np.median(v) * 1e3) for k, v in times.items()}
    size = os.path.getsize(plain) if world.is_main else 0
    result = {"state_bytes": world.comm.bcast(size), "ms": ms,
              "save_vs_torch": ms["hpcddp_save"] / ms["torch_save_fsync"],
              "load_vs_torch": ms["hpcddp_load"] / ms["torch_load"]}
    if world.is_main:
        print(result)
        shutil.rmtree(root, ignore_errors=True)
        os.remove(plain)
    write("checkpoint", {"benchmark": "checkpoint save/load, MLP + Adam", **result}, world)


if __name__ == "__main__":
    main()
