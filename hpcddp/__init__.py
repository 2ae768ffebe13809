"""hpcddp: MPI-native data-parallel training for PyTorch on HPC clusters.

Importing hpcddp starts nothing: the public names below load their modules (torch,
``mpi4py.MPI`` with ``MPI_Init``, h5py) when first used (PEP 562), so a DataLoader
worker that unpickles an ``hpcddp.data.H5Dataset`` never initializes MPI.
"""

import importlib

from hpcddp.version import __version__

_PUBLIC = {
    "init": "hpcddp.runtime", "get_world": "hpcddp.runtime", "shutdown": "hpcddp.runtime",
    "World": "hpcddp.world",
    "DistributedDataParallel": "hpcddp.ddp.module",
    "DistributedSampler": "hpcddp.data.sampler",
    "Preemption": "hpcddp.preemption",
}

__all__ = ["DistributedDataParallel", "DistributedSampler", "Preemption", "World", "__version__",
           "get_world", "init", "shutdown"]


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hpcddp' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
