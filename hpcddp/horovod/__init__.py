"""``horovod.torch``'s API on hpcddp: a Horovod program runs with its import changed.

    import hpcddp.horovod as hvd     # for: import horovod.torch as hvd

``hvd.init()`` starts hpcddp on MPI (``hpcddp.init()``: no rendezvous, the watchdog, the
device per local rank); operations are matched across ranks by name in any order, as
Horovod's engine does (``engine.py``), and run as hpcddp's collectives.
"""

import hpcddp.runtime  # noqa: F401 - first: MPI starts there, as hpcddp starts it
from hpcddp.horovod.basics import (
    Adasum, Average, HorovodInternalError, HostsUpdatedInterrupt, Max, Min, Product, Sum,
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled,
    init, is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, start_timeline,
    stop_timeline)
from hpcddp.horovod.compression import Compression
from hpcddp.horovod.functions import (
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from hpcddp.horovod.gather_ops import (
    allgather, allgather_async, alltoall, alltoall_async, broadcast, broadcast_,
    broadcast_async, broadcast_async_, grouped_allgather, grouped_allgather_async,
    grouped_reducescatter, grouped_reducescatter_async, reducescatter, reducescatter_async,
    sparse_allreduce_async)
from hpcddp.horovod.mpi_ops import (
    allreduce, allreduce_, allreduce_async, allreduce_async_, barrier, grouped_allreduce,
    grouped_allreduce_, grouped_allreduce_async, grouped_allreduce_async_, join, poll,
    synchronize)
from hpcddp.horovod.optimizer import DistributedOptimizer
from hpcddp.horovod.process_sets import (
    ProcessSet, add_process_set, global_process_set, remove_process_set)
from hpcddp.ddp.syncbn import SyncBatchNorm
from hpcddp.horovod import elastic  # hvd.elastic, as horovod.torch has it

__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "SyncBatchNorm", "elastic",
    "allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "HorovodInternalError", "HostsUpdatedInterrupt",
    "Max", "Min", "Product", "ProcessSet", "Sum", "add_process_set", "allgather",
    "allgather_async", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
    "alltoall", "alltoall_async", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "ccl_built", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather",
    "grouped_allgather_async", "grouped_allreduce", "grouped_allreduce_",
    "grouped_allreduce_async", "grouped_allreduce_async_", "grouped_reducescatter",
    "grouped_reducescatter_async", "init", "is_homogeneous", "join", "is_initialized", "local_rank",
    "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built", "poll",
    "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built",
    "shutdown", "size", "sparse_allreduce_async", "start_timeline", "stop_timeline",
    "synchronize"]
