"""A dataset that tells, with every sample, whether its process has initialized MPI.

It lives in a module of its own that imports neither h5py nor mpi4py: a spawned
DataLoader worker imports it to unpickle the dataset.
"""

import sys

import torch

from hpcddp.data.dataset import H5Dataset


class ProbedDataset(H5Dataset):
    """``H5Dataset`` whose samples end with a flag: MPI is initialized in this process."""

    def __getitem__(self, index):
        mpi = sys.modules.get("mpi4py.MPI")
        initialized = bool(mpi is not None and mpi.Is_initialized())
        return super().__getitem__(index) + (torch.tensor(initialized),)
