"""The end of a synchronized backward: one agreement, and errors raised together.

Every rank learns, in one allreduce on the control communicator, which parameters any
rank used (with ``find_unused_parameters``) and whether any rank missed a gradient or got
one twice. When one did, every rank raises the same error, naming each parameter and the
ranks where it happened, as torch's reducer does ("Expected to mark a variable ready only
once") instead of dropping a gradient or leaving the other ranks waiting.
"""

from typing import Sequence

import numpy as np
from mpi4py import MPI

from hpcddp.comm import activity
from hpcddp.comm.ranks import ranks_text

__all__ = ["agree_on_flags", "gone_wrong", "raise_what_went_wrong"]

_TWICE = ("got a gradient twice in one backward",
          "torch raises the same ('Expected to mark a variable ready only once'). A parameter "
          "used inside and outside torch.utils.checkpoint(use_reentrant=True) does this: use "
          "use_reentrant=False")
_MISSING = ("got no gradient in this backward",
            "Pass find_unused_parameters=True if some parameters are not used in every "
            "iteration, or make sure every parameter takes part in the loss.")


def agree_on_flags(control, flags: np.ndarray) -> np.ndarray:
    """``flags`` (uint8) reduced with MAX over the ranks of ``control``: the last flag is
    "a gradient came twice"; without find_unused_parameters the first is "one was missing".

    .. warning:: Collective.
    """
    agreed = np.empty_like(flags)
    with activity.named("DDP end-of-backward agreement"):
        control.Allreduce(flags, agreed, op=MPI.MAX)
    return agreed


def gone_wrong(agreed: np.ndarray, find_unused: bool) -> bool:
    """Whether any rank got a gradient twice, or (without find_unused) missed one."""
    return bool(agreed[-1] or (not find_unused and agreed[0]))


def raise_what_went_wrong(control, names: Sequence[str], agreed: np.ndarray,
                          missing: Sequence[int], twice: Sequence[int]) -> None:
    """Raise on every rank, naming this rank's parameters in ``twice`` (if any rank got a
    gradient twice) or else in ``missing``, with the ranks where each happened.

    .. warning:: Collective.
    """
    what, advice = _TWICE if agreed[-1] else _MISSING
    mine = twice if agreed[-1] else missing
    with activity.named("DDP error report"):
        everyone = control.allgather(sorted(set(mine)))
    where = {}
    for rank, indices in enumerate(everyone):
        for i in indices:
            where.setdefault(names[i], []).append(rank)
    listed = "; ".join(f"{name} (ranks {ranks_text(ranks)})" for name, ranks in where.items())
    raise RuntimeError(f"hpcddp.DistributedDataParallel: parameters {what}: {listed}. "
                       f"{advice}")
