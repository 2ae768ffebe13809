"""A communication hook's state in a checkpoint (PowerSGD's error feedback, iteration
counters): what torch's own ``__getstate__`` keeps.

What is kept: every attribute of the state object but its process groups, with NumPy
generators as tensors, so the checkpoint loads under ``weights_only=True``. Error
feedback is per rank, so every rank's state is saved. A resume on the same number of
ranks puts each rank's back; on another number, only what all ranks share (the iteration
count, the generator) comes back and the per-rank memories start empty, with a warning.
"""

from typing import Optional

import numpy as np
import torch.distributed as dist
from mpi4py import MPI

from hpcddp.checkpoint.rng import numpy_state, set_numpy_state
from hpcddp.env.notices import warn_user

__all__ = ["capture_hook_state", "restore_hook_state"]

_GENERATOR = "__numpy_random_state__"
_PER_RANK = ("error_dict", "p_memory_dict", "q_memory_dict")


def _attributes(state):
    # The attributes torch's __getstate__ returns, without its warning on every call.
    names = getattr(type(state), "__slots__", None) or list(vars(state))
    return {name: getattr(state, name) for name in names if hasattr(state, name)}


def capture_hook_state(state) -> Optional[dict]:
    """The checkpointable part of ``state``, or None for a hook without one."""
    if state is None or isinstance(state, (dist.ProcessGroup, MPI.Comm)):
        return None
    kept = {}
    for name, value in _attributes(state).items():
        if isinstance(value, (dist.ProcessGroup, MPI.Comm)) or value is None:
            continue
        if isinstance(value, np.random.RandomState):
            value = {_GENERATOR: numpy_state(value)}
        kept[name] = value
    return kept


def restore_hook_state(state, saved: Optional[dict], same_ranks: bool, rank: int = 0) -> None:
    """Put ``saved`` (this rank's capture) back into ``state``, in place (``rank`` warns)."""
    if state is None or not saved:
        return
    dropped = []
    for name, value in saved.items():
        if name in _PER_RANK and not same_ranks:
            dropped.append(name)
            continue
        if isinstance(value, dict) and _GENERATOR in value:
            set_numpy_state(getattr(state, name), value[_GENERATOR])
            continue
        setattr(state, name, value)
    if dropped:
        warn_user(f"hpcddp.checkpoint: the comm hook's per-rank state ({', '.join(dropped)}) "
                  f"was saved on another number of ranks and starts empty", rank=rank)
