"""Shared benchmark plumbing: a gloo group beside hpcddp's, timing, JSON output."""

import json
import platform
import socket
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

RESULTS = Path(__file__).resolve().parent / "results"


def gloo_group(world):
    """torch's gloo group on loopback TCP, rank and size from MPI (the peer we compare)."""
    port = None
    if world.rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = world.comm.bcast(port, root=0)
    store = dist.TCPStore("127.0.0.1", port, world.size, world.rank == 0,
                          timeout=timedelta(seconds=60))
    return dist.ProcessGroupGloo(store, world.rank, world.size, timedelta(seconds=60))


def timed(comm, fn):
    """Run ``fn`` once between barriers; return the slowest rank's seconds."""
    comm.Barrier()
    start = time.perf_counter()
    fn()
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def machine():
    return {"host": socket.gethostname(), "python": platform.python_version(),
            "torch": torch.__version__, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "cpus": len(__import__("os").sched_getaffinity(0))}


def median_ms(samples):
    return float(np.median(samples) * 1e3)


def write(name, payload, world):
    """Write ``results/<name>.json`` on rank 0 and return its path."""
    if not world.is_main:
        return None
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = dict(payload, machine=machine(), world_size=world.size)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
