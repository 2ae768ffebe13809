"""Checkpoint save and load against plain torch.save + fsync and torch.load.

Run: ``mpiexec -n 2 python benchmarks/bench_checkpoint.py [--dir /tmp]``. The state is
the 24 MB MLP of the DDP benchmark with Adam (about 72 MiB). Interleaved, median of
``--repeats`` with the spread (min, max); each figure is the slowest rank's time.

Peers: ``torch.save`` + fsync on rank 0; ``torch.load`` of the file on every rank (what a
torch script does to resume) and on rank 0 alone, and on every rank the same followed by the model's and the optimizer's
``load_state_dict`` (which hpcddp's load includes). Also the checksums a corruption check
could use, each on the state's bytes in memory (blake3 and crc32c with the ``bench``
extra installed).
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
        return torch.load(plain, weights_only=True)

    def torch_load_one_rank():  # the file read by rank 0 alone, as the first round measured
        if world.is_main:
            torch_load()

    def torch_load_and_apply():
        loaded = torch_load()
        model.module.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["optimizer"])

    def bcast_alone():
        size = world.comm.bcast(os.path.getsize(plain) if world.is_main else None)
        world.comm.Bcast(np.empty(size, np.uint8), root=0)

    runs = {"hpcddp_save": lambda: checkpoint.save(root, model, opt, step=1, keep_last=1),
            "torch_save_fsync": torch_save,
            "hpcddp_load": lambda: checkpoint.load(root, model, opt),
            "torch_load": torch_load,
            "torch_load_one_rank": torch_load_one_rank,
            "torch_load_and_apply": torch_load_and_apply,
            "part_bcast_of_state": bcast_alone}
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
    spread = {k: [float(min(v) * 1e3), float(max(v) * 1e3)] for k, v in times.items()}
    size = os.path.getsize(plain) if world.is_main else 0
    result = {"state_bytes": world.comm.bcast(size), "ms": ms, "ms_min_max": spread,
              "save_vs_torch": ms["hpcddp_save"] / ms["torch_save_fsync"],
              "load_vs_torch_load": ms["hpcddp_load"] / ms["torch_load"],
              "load_vs_torch_load_one_rank": ms["hpcddp_load"] / ms["torch_load_one_rank"],
              "load_vs_torch_load_and_apply": ms["hpcddp_load"] / ms["torch_load_and_apply"],
              "checksum_GiBps": _checksums(plain, args.repeats) if world.is_main else None}
    if world.is_main:
        print(result)
        shutil.rmtree(root, ignore_errors=True)
        os.remove(plain)
    write("checkpoint", {"benchmark": "checkpoint save/load, MLP + Adam", **result}, world)


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
