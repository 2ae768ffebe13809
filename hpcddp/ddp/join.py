"""Uneven inputs: the collectives a rank that has run out of data shadows under ``Join``.

torch's ``Join`` context manager loops on a rank that has left its training loop: an
allreduce on the join group counts the ranks still training (matched by the
``notify_join_context`` allreduce each of them makes at the start of forward), then the
``main_hook`` of each joinable issues what one training iteration of the others issues.
For hpcddp's DDP that is, per iteration and in this order:

1. on the control communicator: the rank buffers come from (the highest rank still
   training, as in torch: rank 0 may have joined with stale buffers) and their
   broadcast, when buffers are synchronized;
2. on the control communicator: whether this iteration's backward is synchronized;
3. if so, on the gradient communicator (or the hook's group): every bucket through the
   hook, with zeros; then the end-of-backward agreement on the control communicator.

When every rank has joined, the ``post_hook`` broadcasts the model of the last rank to
join, so all replicas end equal.
"""

import numpy as np
from mpi4py import MPI
from torch.distributed.algorithms.join import JoinHook

from hpcddp.comm import activity

__all__ = ["DDPJoinHook", "agree_on_sync", "common_rank"]


def common_rank(control, candidate: bool) -> int:
    """The highest rank of ``control`` where ``candidate`` is true.

    .. warning:: Collective.
    """
    with activity.blocking("Join: which rank holds the model", control):
        rank = control.allreduce(control.rank if candidate else -1, op=MPI.MAX)
    if rank < 0:
        raise RuntimeError("hpcddp Join: no rank qualified to provide the model state; "
                           "this is a bug in hpcddp")
    return rank


class _Started:
    """A started message and its buffers, which must live until it completes (an mpi4py
    request does not keep a collective's arrays alive)."""

    __slots__ = ("request", "buffers", "wait_in")

    def __init__(self, request, buffers, wait_in):
        self.request, self.buffers, self.wait_in = request, buffers, wait_in

    def wait(self) -> None:
        with self.wait_in:
            self.request.Wait()


def agree_on_sync(control, sync: bool, wait: bool):
    """Whether any rank still training synchronizes this backward.

    Ranks still training start it and go on (``wait=False`` returns a ``_Started`` to
    complete later); a joined rank waits for the answer.

    .. warning:: Collective.
    """
    mine = np.array([1 if sync else 0], dtype=np.int32)
    answer = np.empty_like(mine)
    request = control.Iallreduce(mine, answer, op=MPI.MAX)
    channel = activity.channel_for(control)
    wait_in = activity.waiting("DDP agreement on syncing this backward", channel,
                               channel.issue("DDP agreement on syncing this backward"))
    if not wait:
        return _Started(request, (mine, answer), wait_in)
    with wait_in:
        request.Wait()
    return bool(answer[0])


class DDPJoinHook(JoinHook):
    """Shadows hpcddp DDP's per-iteration collectives on a rank that has joined.

    Args:
        ddp: the ``hpcddp.DistributedDataParallel``, whose ``join_hook`` made this and
            set its divisor (``divide_by_initial_world_size``).
    """

    def __init__(self, ddp):
        self.ddp = ddp

    def main_hook(self) -> None:
        ddp = self.ddp
        ddp._sync_buffers(joined=True)
        sync = ddp._agree_on_sync(False, wait=True)
        ddp.require_forward_param_sync = sync
        if sync:
            # The ranks still training rebuild the buckets (once) only in a forward that
            # syncs, after this agreement (module.forward): the same collectives, in order.
            ddp.reducer.prepare_for_forward()
            ddp.reducer.shadow_backward()

    def post_hook(self, is_last_joiner: bool) -> None:
        self.ddp._take_last_joiners_model(is_last_joiner)
