"""Shared benchmark plumbing: timing, JSON output, and the gloo reference group."""

import json
import platform
import socket
import sys
import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

from hpcddp.startup.mpi_library import library_version_line

RESULTS = Path(__file__).resolve().parent / "results"

# The gloo group the tests compare against is the peer the benchmarks measure: taken from
# the tests' shared helpers (tests/support), never from one suite's folder.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from gloo_group import make_gloo_group  # noqa: E402,F401


def timed(comm, fn):
    """Run ``fn`` once between barriers; return the slowest rank's seconds."""
    comm.Barrier()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # GPU work is asynchronous: time it to the end
    return comm.allreduce(time.perf_counter() - start, op=MPI.MAX)


def machine():
    return {"host": socket.gethostname(), "python": platform.python_version(),
            "torch": torch.__version__,
            "mpi": library_version_line(),
            "cpus": len(__import__("os").sched_getaffinity(0))}


def median_ms(samples):
    return float(np.median(samples) * 1e3)


def interleaved_seconds(comm, runs, iters):
    """Warm each of ``runs`` up once, then time them in turn ``iters`` times.

    Returns ``{name: [the slowest rank's seconds, one per turn]}``; interleaving keeps a
    drift in the machine's speed from favouring one of them, and the i-th samples of two
    runs were taken moments apart (for paired ratios).
    """
    samples = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(iters):
        for name, fn in runs.items():
            samples[name].append(timed(comm, fn))
    return samples


def interleaved_ms(comm, runs, iters):
    """``interleaved_seconds`` as ``{"<name>_ms": median}``."""
    return {f"{name}_ms": median_ms(values)
            for name, values in interleaved_seconds(comm, runs, iters).items()}


def write(name, payload, world):
    """Write ``results/<name>.json`` on rank 0 and return its path."""
    if not world.is_main:
        return None
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = dict(payload, machine=machine(), world_size=world.size)
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
