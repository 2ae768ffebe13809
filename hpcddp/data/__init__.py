"""Training data from HDF5: the distributed sampler, a dataset, and the sharded loader.

Importing this package starts nothing; each name loads its module on first use, so a
DataLoader worker that unpickles an ``H5Dataset`` loads the dataset alone.
"""

import importlib

_PUBLIC = {
    "DataFileError": "h5file", "inspect_file": "h5file",
    "DistributedSampler": "sampler", "H5Dataset": "dataset", "ShardedLoader": "loader",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hpcddp.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"hpcddp.data.{_PUBLIC[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_PUBLIC))
