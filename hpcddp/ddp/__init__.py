"""Distributed data parallel training: bucketing, the reducer, and the module wrapper."""

from hpcddp.ddp.module import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
