"""Training data from HDF5: the distributed sampler, a dataset, and the sharded loader.

Importing this package starts nothing; each name loads its module on first use, so a
DataLoader worker that unpickles an ``H5Dataset`` loads the dataset alone.
"""

from hpcddp.lazy import lazy_names

_PUBLIC = {
    "DataFileError": ".h5file", "inspect_file": ".h5file",
    "DistributedSampler": ".sampler", "H5Dataset": ".dataset", "ShardedLoader": ".loader",
    "decode_jpeg": ".images", "jpeg_decoder": ".images", "progress": ".progress",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
