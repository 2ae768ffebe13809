"""The timeline's torch side: spans in torch.profiler traces, and the optimizer step.

``hpcddp.timeline`` records; this module connects it to torch. ``connect()`` (run
by ``hpcddp.init()``) lets every hpcddp span also open a ``record_function`` while
torch.profiler runs, so a torch profile shows hpcddp's forward, bucket launches, waits,
copies back and loader waits beside torch's own ops. ``start_timeline()`` starts a
recording and times every optimizer's ``step()`` through torch's global optimizer hooks.
"""

import torch
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from hpcddp import timeline
from hpcddp.torch_compat import profiler_check

__all__ = ["connect", "start_timeline"]

_began = {}
_hooked = []


def connect() -> None:
    """Mirror hpcddp's spans into torch.profiler traces while it runs."""
    timeline.mirror(profiler_check(), torch.profiler.record_function)


def _before_step(optimizer, args, kwargs):
    _began[id(optimizer)] = timeline.now()


def _after_step(optimizer, args, kwargs):
    began = _began.pop(id(optimizer), None)
    if began is not None:
        timeline.mark(f"{type(optimizer).__name__}.step", timeline.COMPUTE, began)


def start_timeline(path: str, comm, limit: int = 1_000_000) -> timeline.Timeline:
    """Record a timeline of every rank of ``comm`` into ``path`` (written at shutdown).

    .. warning:: Collective.
    """
    recorder = timeline.start(path, comm, limit)
    if not _hooked:  # torch's hooks are global: once per process
        _hooked.append((register_optimizer_step_pre_hook(_before_step),
                        register_optimizer_step_post_hook(_after_step)))
    return recorder
