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
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from hpcddp.comm import activity
from hpcddp.ddp.grad_bucket import GradBucket
from hpcddp.ddp.sparse import allreduce_sparse
from hpcddp.ddp.sync import broadcast_tensors

__all__ = ["DDPJoinHook", "DDPJoinable", "agree_on_sync", "common_rank"]


def common_rank(control, candidate: bool) -> int:
    """The highest rank of ``control`` where ``candidate`` is true.

    .. warning:: Collective.
    """
    with activity.named("Join: which rank holds the model"):
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
        self._shadows = None  # made on first use: a rank that joins early shadows every step

    def main_hook(self) -> None:
        ddp = self.ddp
        ddp._sync_buffers(joined=True)
        sync = ddp._agree_on_sync(False, wait=True)
        ddp.require_forward_param_sync = sync
        if sync:
            # The ranks still training rebuild the buckets (once) only in a forward that
            # syncs, after this agreement (module.forward): the same collectives, in order.
            ddp.reducer.prepare_for_forward()
            self._shadow_backward(ddp.reducer)

    def _shadow_backward(self, reducer) -> None:
        """Mirror the collectives of a synchronized backward of the ranks still training:
        every bucket through the hook with zeros, then the end-of-backward agreement.
        ``.grad`` is left alone.

        .. warning:: Collective, matching one synchronized backward elsewhere.
        """
        shadows = self._shadow_buckets(reducer)
        reducer.begin_step()
        for bucket in shadows:
            bucket.storage.zero_()
            bucket.start(reducer.hook)
        reducer.agree(np.zeros(reducer.agreement_flags(), dtype=np.uint8), [], [], shadows)
        reducer.transport.issue_all()
        for bucket in shadows:
            bucket.finish()
        for index in reducer.sparse:
            allreduce_sparse(reducer.comm, None, reducer.params[index], reducer.sparse_divisor())
        reducer.schedule_rebuild()

    def _shadow_buckets(self, reducer):
        layouts = reducer.layouts
        if self._shadows is None or [b.layout for b in self._shadows] != layouts:
            self._shadows = [GradBucket(b, len(layouts), layout, reducer.params)
                             for b, layout in enumerate(layouts)]
            for bucket in self._shadows:
                bucket.route = reducer.transport.route_for(bucket.storage)
        return self._shadows

    def post_hook(self, is_last_joiner: bool) -> None:
        self.ddp._take_last_joiners_model(is_last_joiner)


class DDPJoinable(Joinable):
    """The part of ``hpcddp.DistributedDataParallel`` in torch's ``Join`` (a base of the
    wrapper): the context manager, the hook a joined rank runs, and what that hook asks
    of the wrapper."""

    def join(self, divide_by_initial_world_size: bool = True, enable: bool = True,
             throw_on_early_termination: bool = False) -> Join:
        """A context manager for training on uneven inputs, as torch's ``model.join()``.

        A rank that runs out of batches shadows the collectives of those still training
        until every rank is done; then all ranks take the model of the last to finish.

        Args:
            divide_by_initial_world_size: average gradients over all ranks (True) or over
                those still training (False).
            enable: False turns the context manager off.
            throw_on_early_termination: raise on every rank as soon as one runs out.

        Example::

            with model.join():
                for x, y in my_uneven_batches:
                    loss_fn(model(x), y).backward()
                    opt.step()

        .. warning:: Under Join each forward adds two small collectives.
        """
        return Join([self], enable, throw_on_early_termination,
                    divide_by_initial_world_size=divide_by_initial_world_size)

    def join_hook(self, **kwargs) -> DDPJoinHook:
        """The hook ``torch.distributed.algorithms.Join`` runs on a rank that has joined."""
        self._divide_by_initial_world_size = kwargs.get("divide_by_initial_world_size", True)
        return DDPJoinHook(self)

    def _agree_on_sync(self, sync: bool, wait: bool):
        """Under Join: whether any rank still training synchronizes this backward
        (``join.agree_on_sync``)."""
        return agree_on_sync(self._control, sync, wait)

    def _take_last_joiners_model(self, is_last_joiner: bool) -> None:
        """Under Join, once every rank has joined: every rank takes the parameters (and
        the synchronized buffers) of the last rank to join, so all replicas end equal."""
        root = common_rank(self._control, is_last_joiner)
        tensors = [p.detach() for p in self.module.parameters()]
        if self.forward_sync_buffers:
            tensors += [b.detach() for b in self._buffers_to_sync]
        broadcast_tensors(self._control_transport, tensors, root)

    @property
    def join_device(self) -> torch.device:
        return self.reducer.params[0].device

    @property
    def join_process_group(self):
        if self.process_group is None:
            return dist.group.WORLD
        if isinstance(self.process_group, MPI.Comm):
            raise TypeError("Join needs a torch.distributed group: this wrapper was given an "
                            "mpi4py communicator. Pass process_group=dist.new_group(ranks) "
                            "(after hpcddp.init()) instead")
        return self.process_group
