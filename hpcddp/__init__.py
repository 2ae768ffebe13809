"""hpcddp: MPI-native data-parallel training for PyTorch on HPC clusters."""

__version__ = "0.1.0"

from hpcddp.world import World, get_world, init, shutdown  # noqa: E402
from hpcddp.ddp import DistributedDataParallel  # noqa: E402
from hpcddp.data.sampler import DistributedSampler  # noqa: E402
from hpcddp.preemption import Preemption  # noqa: E402

__all__ = ["DistributedDataParallel", "DistributedSampler", "Preemption", "World", "__version__",
           "get_world", "init", "shutdown"]
