"""torch.distributed allreduce through hpcddp's MPI group, against gloo and raw mpi4py.

Run: ``mpiexec -n 2 python benchmarks/bench_allreduce.py``. The three are interleaved
in one job on the same buffers; each figure is the median of the slowest rank's time.
"""

import argparse

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import hpcddp
from common import interleaved_ms, make_gloo_group, write


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    world = hpcddp.init()
    _group, gloo, _store = make_gloo_group(world)
    rows = []
    for nbytes in (4 << 10, 256 << 10, 4 << 20, 32 << 20):
        tensor = torch.ones(nbytes // 4)
        array = np.ones(nbytes // 4, dtype=np.float32)
        runs = {
            "hpcddp": lambda: dist.all_reduce(tensor),
            "gloo": lambda: gloo.allreduce([tensor]).wait(),
            "mpi4py": lambda: world.comm.Allreduce(MPI.IN_PLACE, array),
        }
        row = {"bytes": nbytes, **interleaved_ms(world.comm, runs, args.iters)}
        row["hpcddp_vs_gloo"] = row["hpcddp_ms"] / row["gloo_ms"]
        row["hpcddp_vs_mpi4py"] = row["hpcddp_ms"] / row["mpi4py_ms"]
        rows.append(row)
        if world.is_main:
            print(f"{nbytes:>10} B  hpcddp {row['hpcddp_ms']:8.3f} ms  gloo {row['gloo_ms']:8.3f} ms"
                  f"  mpi4py {row['mpi4py_ms']:8.3f} ms  hpcddp/gloo {row['hpcddp_vs_gloo']:.2f}"
                  f"  hpcddp/mpi4py {row['hpcddp_vs_mpi4py']:.2f}", flush=True)
    path = write("allreduce", {"benchmark": "torch.distributed all_reduce, float32",
                               "iters": args.iters, "rows": rows}, world)
    if path:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
