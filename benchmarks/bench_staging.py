"""One bucket's trip through MPI from a GPU, taken apart: the staged path (copy to pinned
memory on a side stream, ``Iallreduce``, copy back; in 4 MiB pieces, and whole) against
its parts, against gloo's allreduce of the same CUDA tensor, and against the
device-buffer path where MPI is CUDA-aware.

Run on a GPU machine: ``mpiexec -n 2 python benchmarks/bench_staging.py``. Each figure is
the median of the slowest rank's time, with the GPU synchronized at the end.
"""

import argparse

import torch
from mpi4py import MPI

import hpcddp
from common import interleaved_ms, make_gloo_group, write
from hpcddp.transport import Transport
from hpcddp.transport.pinned import pinned_empty


def _trip(transport, bucket):
    transport.allreduce(bucket, slot=0).wait()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    world = hpcddp.init()
    if world.device.type != "cuda":
        raise SystemExit("bench_staging.py measures the GPU paths; this rank has no GPU")
    _group, gloo, _store = make_gloo_group(world)
    staged = Transport(world.comm, cuda_aware=False)  # 4 MiB pieces, the default
    whole = Transport(world.comm, cuda_aware=False, chunk_bytes=0)
    device = Transport(world.comm, cuda_aware=True) if world.cuda_aware else None
    rows = []
    for nbytes in (1 << 20, 4 << 20, 16 << 20, 24 << 20):
        bucket = torch.ones(nbytes // 4, device=world.device)
        host = pinned_empty(nbytes).view(torch.float32)
        runs = {
            "staged_trip": lambda: _trip(staged, bucket),
            "staged_whole_trip": lambda: _trip(whole, bucket),
            "copies_only": lambda: bucket.copy_(host.copy_(bucket, non_blocking=True),
                                                non_blocking=True),
            "iallreduce_pinned": lambda: world.comm.Iallreduce(MPI.IN_PLACE, host.numpy()).Wait(),
            "allreduce_pinned": lambda: world.comm.Allreduce(MPI.IN_PLACE, host.numpy()),
            "gloo_cuda": lambda: gloo.allreduce([bucket]).wait(),
        }
        if device is not None:
            runs["device_trip"] = lambda: _trip(device, bucket)
        row = {"bytes": nbytes, **interleaved_ms(world.comm, runs, args.iters)}
        row["staged_vs_gloo"] = row["staged_trip_ms"] / row["gloo_cuda_ms"]
        row["staged_vs_iallreduce_pinned"] = row["staged_trip_ms"] / row["iallreduce_pinned_ms"]
        rows.append(row)
        if world.is_main:
            print(f"{nbytes >> 20:>3} MiB  " + "  ".join(
                f"{k[:-3]} {v:7.3f}" for k, v in row.items() if k.endswith("_ms")) +
                f"  staged/gloo {row['staged_vs_gloo']:.2f}", flush=True)
    path = write("staging_cuda", {"benchmark": "one bucket's allreduce from a GPU",
                                  "gpu": torch.cuda.get_device_name(),
                                  "cuda_aware": world.cuda_aware,
                                  "cuda_aware_reason": world.cuda_aware_reason,
                                  "iters": args.iters, "rows": rows}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
