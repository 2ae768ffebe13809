"""hpcddp: MPI-native data-parallel training for PyTorch on HPC clusters.

Importing hpcddp starts nothing: the public names below load their modules (torch,
``mpi4py.MPI`` with ``MPI_Init``, h5py) when first used (PEP 562), so a DataLoader
worker that unpickles an ``hpcddp.data.H5Dataset`` never initializes MPI.
"""

from hpcddp.faults.abort import install_early_hook
from hpcddp.lazy import after_import, before_import, later, lazy_names
from hpcddp.version import __version__

_PUBLIC = {
    "init": "hpcddp.runtime", "get_world": "hpcddp.runtime", "shutdown": "hpcddp.runtime",
    "World": "hpcddp.runtime.world",
    "DistributedDataParallel": "hpcddp.ddp.module",
    "DistributedSampler": "hpcddp.data.sampler",
    "Preemption": "hpcddp.runtime.preemption",
    "SyncBatchNorm": "hpcddp.ddp.syncbn",
    "fp16_compress_hook": "hpcddp.ddp.hooks", "bf16_compress_hook": "hpcddp.ddp.hooks",
    "mpi_call": "hpcddp.comm.serial",
}

__all__ = ["DistributedDataParallel", "DistributedSampler", "Preemption", "SyncBatchNorm", "World", "__version__",
           "bf16_compress_hook", "fp16_compress_hook", "get_world", "init", "mpi_call",
           "shutdown"]

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)

# A rank that raises before hpcddp.init() ends the job instead of leaving the others
# waiting in initialization (hpcddp.faults.abort); this imports no MPI.
install_early_hook()

# The mpich wheel's network module is chosen before MPI_Init reads it, whoever starts MPI
# (hpcddp.init(), importing hpcddp.ddp or hpcddp.checkpoint, the script's own mpi4py.MPI
# after import hpcddp): hpcddp.env.netmod.
before_import("mpi4py.MPI", "hpcddp.env.netmod:apply_netmod")
# `dist.init_process_group("hpcddp")` works once hpcddp is imported (hpcddp.backend.torch_init):
# the backend is registered as soon as torch.distributed is, by whoever imports it, and
# given hpcddp's world (hpcddp.runtime, loaded when torch first asks for a group).
after_import("torch.distributed", "hpcddp.backend.torch_init:register",
             later("hpcddp.runtime:world_for_torch"))
# torch's own thread count, noted as torch is imported: one the script sets afterwards,
# before init(), is kept (hpcddp.env.torch_threads).
after_import("torch", "hpcddp.env.torch_threads:note_torch_default")
# A rank of a job of several that reaches its first optimizer step with no process group
# (hpcddp.init() forgotten) raises instead of training alone (hpcddp.backend.torch_init).
after_import("torch.optim.optimizer", "hpcddp.backend.torch_init:watch_for_training_alone")
