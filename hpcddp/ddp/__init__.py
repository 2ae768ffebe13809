"""Distributed data parallel training: bucketing, the reducer, and the module wrapper."""

import hpcddp.runtime  # noqa: F401 - first: MPI starts there, as hpcddp starts it
from hpcddp.ddp.module import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
