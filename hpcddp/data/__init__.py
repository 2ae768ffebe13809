"""Training data from HDF5: the distributed sampler, a dataset, and the sharded loader."""

from hpcddp.data.dataset import H5Dataset
from hpcddp.data.h5file import DataFileError, inspect_file
from hpcddp.data.loader import ShardedLoader
from hpcddp.data.sampler import DistributedSampler

__all__ = ["DataFileError", "DistributedSampler", "H5Dataset", "ShardedLoader", "inspect_file"]
