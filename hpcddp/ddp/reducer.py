"""The reducer: wires autograd hooks to buckets, and buckets to the bucket hook.

Life of one synchronized backward:

1. A parameter's post-accumulate-grad hook puts its gradient into its bucket
   (``GradBucket.fill``, which divides by the hook's divisor), or, with
   ``gradient_as_bucket_view``, makes ``.grad`` a view of the bucket. A solo bucket
   (a large parameter in host memory) adopts the gradient itself instead.
2. When a bucket's last gradient is in, it is handed to the bucket hook (``hooks.py``;
   by default an allreduce through the ``Transport``), strictly in bucket order: MPI
   needs every rank to issue collectives on a communicator in the same order, and
   gradients become ready in different orders on different ranks (torch's reducer does
   the same).
3. Every hook calls ``advance`` on the transport: MPI makes no progress while Python
   computes, and a pending 16 MB allreduce left alone cost its full time at ``Wait``.
4. At the end of backward (an autograd engine callback) the ranks agree, on a separate
   control communicator, whether any parameter got no gradient or got one twice, then
   wait for every bucket and leave the result in ``.grad``.
"""

import functools
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from hpcddp import timeline
from hpcddp.comm import activity
from hpcddp.comm.progress_thread import ProgressPump
from hpcddp.comm.thread_level import helper_threads_allowed
from hpcddp.ddp.agreement import agree_on_flags, gone_wrong, raise_what_went_wrong
from hpcddp.ddp.buckets import FIRST_BUCKET_BYTES, SOLO_BYTES, ParamSpec, assign_buckets
from hpcddp.ddp.grad_bucket import GradBucket, is_view_of
from hpcddp.ddp.hooks import AllreduceMean, hook_for
from hpcddp.ddp.sparse import allreduce_sparse
from hpcddp.torch_compat import queue_backward_callback
from hpcddp.transport import Transport

__all__ = ["Reducer"]


class Reducer:
    """Reduces the gradients of ``params`` across the ranks of ``comm`` during backward.

    Args:
        named_params: ``(name, parameter)`` pairs, in registration order.
        comm: the communicator for gradient data (a private duplicate).
        control: a second private communicator for small agreement messages, so they
            can never be matched against a bucket's allreduce.
        cap_bytes: the bucket size cap.
        find_unused_parameters, static_graph, gradient_as_bucket_view, cuda_aware: as
            for ``DistributedDataParallel``.
        progress_thread: run a ``ProgressPump`` during backward (``HPCDDP_PROGRESS_THREAD``).
        staging_chunk_bytes: staged GPU buckets travel in pieces of this size, 0 whole
            (``HPCDDP_STAGING_CHUNK_KB``).
        reduction: ``"mpi"`` or ``"ring"`` (``World.reduction``).
        first_cap_bytes: the first bucket's cap (torch: 1 MiB unless a cap is given).
        solo_bytes: host parameters at least this large are reduced in their own
            gradients, not copied into a bucket (``HPCDDP_SOLO_BUCKET_KB``); 0 never.
        sparse: indices of parameters whose gradients are sparse (``sparse.py``); they
            are reduced apart from the buckets at the end of backward.

    With ``static_graph``, the first backward only counts how often each parameter's
    hook fires and reduces everything at its end (torch's "delayed allreduce"); later
    ones fill a parameter's bucket at its last firing (a parameter used twice, as under
    reentrant checkpointing, is fine) and treat parameters never used as ready at once.
    """

    def __init__(self, named_params, comm, control, cap_bytes, *,
                 find_unused_parameters=False, static_graph=False,
                 gradient_as_bucket_view=False, cuda_aware=False, progress_thread=False,
                 staging_chunk_bytes=4 << 20, reduction="mpi",
                 first_cap_bytes=FIRST_BUCKET_BYTES, solo_bytes=SOLO_BYTES, sparse=()):
        self.names = [name for name, _ in named_params]
        self.params = [param for _, param in named_params]
        self.comm, self.control = comm, control
        self.cap_bytes, self.first_cap_bytes = cap_bytes, first_cap_bytes
        self.solo_bytes = solo_bytes
        # A static graph agrees on used parameters like find_unused_parameters does, so a
        # parameter never used keeps no gradient, as in torch.
        self.find_unused = find_unused_parameters or static_graph
        self.static_graph = static_graph
        self._expected: Optional[np.ndarray] = None  # hook firings per parameter (static)
        self._fires = np.zeros(len(named_params), dtype=np.int32)
        self.sparse = sorted(sparse)
        self.as_view = gradient_as_bucket_view
        self.cuda_aware = cuda_aware
        self.transport = Transport(comm, cuda_aware, chunk_bytes=staging_chunk_bytes,
                                   reduction=reduction)
        self.hook = AllreduceMean(self.transport)
        self.hook_state = None
        self._hook_registered = False
        self.progress_thread = progress_thread
        self._pump: Optional[ProgressPump] = None
        self.specs = [ParamSpec(p.numel(), p.element_size(), str(p.dtype), str(p.device))
                      for p in self.params]
        # Called with timeline.now() at the first gradient once a synchronized backward
        # and its communication are done (the autotuner's measure).
        self.timer: Optional[Callable[[int], None]] = None
        self._can_rebuild = static_graph or not find_unused_parameters
        self._ready_order: Optional[List[int]] = [] if self._can_rebuild else None
        self._rebuild_order: Optional[List[int]] = None
        self._armed = self._sync = self._callback_queued = False
        self._backward_began = 0  # timeline.now() at this backward's first gradient
        self._used = np.zeros(len(self.params), dtype=np.uint8)
        self._twice: List[int] = []
        self._build(list(reversed(range(len(self.params)))))
        self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, i))
                       for i, p in enumerate(self.params)]

    # -- layout ------------------------------------------------------------------------

    def _build(self, order: Sequence[int]) -> None:
        dense = [i for i in range(len(self.params)) if i not in self.sparse]
        position = {index: k for k, index in enumerate(dense)}
        layouts = [layout._replace(params=tuple(dense[k] for k in layout.params))
                   for layout in assign_buckets([self.specs[i] for i in dense],
                                                [position[i] for i in order if i in position],
                                                self.cap_bytes, self.first_cap_bytes,
                                                self.solo_bytes)]
        # The old buckets go first, as in torch's reducer: kept until the new ones exist,
        # a rebuild (after the first iteration) would hold the gradients' size twice. A
        # .grad that views an old bucket keeps its part alive until copied over below.
        self.buckets = []
        self.buckets = [GradBucket(b, len(layouts), layout, self.params)
                        for b, layout in enumerate(layouts)]
        self._where = {}
        for b, bucket in enumerate(self.buckets):
            bucket.route = self.transport.route_for(self.params[bucket.layout.params[0]])
            for k, index in enumerate(bucket.layout.params):
                self._where[index] = (b, k)
                param = self.params[index]
                if self.as_view and param.grad is not None and not bucket.layout.solo:
                    bucket.views[k].copy_(param.grad)
                    param.grad = bucket.views[k]

    def set_comm_hook(self, state, hook) -> None:
        """Use ``hook(state, bucket)`` for every bucket from now on (once per reducer)."""
        if self._hook_registered:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be "
                               "called once (as in torch's DDP)")
        self.hook = hook_for(state, hook, self.transport)
        self.hook_state, self._hook_registered = state, True

    @property
    def layouts(self):
        """The bucket layouts, in launch order."""
        return [bucket.layout for bucket in self.buckets]

    def bucket_order(self) -> List[int]:
        """Parameter indices in bucket order (what a rebuild or a resume reproduces)."""
        return [i for layout in self.layouts for i in layout.params]

    def rebuild(self, order: Sequence[int]) -> None:
        """Lay the buckets out again for ``order``, e.g. one saved in a checkpoint."""
        self._build(list(order))
        self._ready_order = None

    def retune(self, reduction: str, cap_bytes: int, first_cap_bytes: int,
               solo_bytes: int) -> None:
        """Reduce with ``reduction`` and lay the buckets out again with these caps, in the
        present bucket order. Between backwards only: gradients in flight keep theirs.

        .. warning:: Collective, at the same step on every rank (``autotune.py``).
        """
        if self.transport.pending() or any(b.handle is not None for b in self.buckets):
            raise RuntimeError("Reducer.retune during a backward: buckets change only "
                               "between steps")
        self.transport.use_reduction(reduction)
        self.cap_bytes, self.first_cap_bytes, self.solo_bytes = \
            cap_bytes, first_cap_bytes, solo_bytes
        self.rebuild(self.bucket_order())

    def prepare_for_forward(self) -> None:
        """Rebuild the buckets once, after the first iteration, in the observed order.

        Rank 0's order is broadcast so every rank has the same layout.

        .. warning:: Collective on the first forward after the first backward.
        """
        if self._rebuild_order is None:
            return
        observed, self._rebuild_order = self._rebuild_order, None
        with activity.named("DDP bucket order from rank 0"):
            order = self.control.bcast(observed, root=0)
        seen = set(order)
        order = order + [i for i in reversed(range(len(self.params))) if i not in seen]
        self.rebuild(order)

    def prepare_for_backward(self, sync: bool) -> None:
        """Arm the hooks for the backward that follows this forward."""
        self._armed, self._sync, self._callback_queued = True, sync, False
        self.transport.end_backward()  # a backward that raised left it begun
        if not sync:
            return
        self.begin_step()
        self._used[:] = 0
        self._fires[:] = 0
        self._twice = []
        self._next = 0
        for bucket in self.buckets:
            bucket.release()
            bucket.pending = set(bucket.layout.params)
            bucket.handle = None
        if self._expected is not None:
            for index in np.flatnonzero(self._expected == 0):
                if index in self._where:  # never used in a static graph: ready at once
                    b, k = self._where[index]
                    self.buckets[b].views[k].zero_()
                    self.buckets[b].pending.discard(index)

    def begin_step(self) -> None:
        """Count a synchronized step on the gradient channel (the watchdog's report of
        uneven inputs compares the ranks' steps)."""
        self.transport.channel.begin_step()

    # -- backward ----------------------------------------------------------------------

    def _on_grad(self, index: int, param: torch.Tensor) -> None:
        if not (self._armed and self._sync):
            return  # no_sync: gradients accumulate locally, nothing is communicated
        if not self._callback_queued:
            queue_backward_callback(self._finalize)
            self._callback_queued, self._backward_began = True, timeline.now()
            self.transport.begin_backward()  # hooks hand launches over, and go on
        if self.static_graph:
            self._fires[index] += 1
            if self._expected is None:  # the first backward: count, reduce at its end
                if self._fires[index] == 1 and self._ready_order is not None:
                    self._ready_order.append(index)
                return
            if self._fires[index] < self._expected[index]:
                return  # more of this parameter's gradient is still to come
            if self._fires[index] > self._expected[index]:
                self._twice.append(index)
                return
        elif self._used[index]:
            # Its bucket may be in flight already; the ranks learn of it together at the
            # end of backward and raise there.
            self._twice.append(index)
            return
        self._mark_ready(index, param)

    def _mark_ready(self, index: int, param: torch.Tensor) -> None:
        self._used[index] = 1
        if index not in self._where:
            return  # sparse: reduced at the end of backward
        if self._ready_order is not None and not self.static_graph:
            self._ready_order.append(index)
        b, k = self._where[index]
        bucket = self.buckets[b]
        bucket.fill(k, param.grad, self.hook.divisor)
        if self.as_view and not is_view_of(param.grad, bucket.views[k]):
            param.grad = bucket.views[k]
        bucket.pending.discard(index)
        if not self._launch_ready():
            self.progress()  # a launch has just advanced the transport

    def _launch_ready(self) -> bool:
        """Start the buckets whose gradients are all in, in order; whether any started."""
        first = self._next
        while self._next < len(self.buckets) and not self.buckets[self._next].pending:
            with timeline.span(f"launch bucket {self._next}", timeline.REDUCER):
                self.buckets[self._next].start(self.hook)
            self._next += 1
        if self.progress_thread and self._pump is None and self._next and helper_threads_allowed(
                "the progress pump (HPCDDP_PROGRESS_THREAD=1)",
                "MPI progresses only at gradient hooks"):
            self._pump = ProgressPump()
        return self._next > first

    @property
    def collectives(self) -> int:
        """MPI reductions issued so far, for inspection."""
        return self.transport.collectives

    def progress(self) -> None:
        """Issue the buckets whose data is ready, and let MPI advance the pending ones
        (``Test`` on each)."""
        self.transport.advance()

    def _finalize(self) -> None:
        began = self._backward_began
        if began:
            timeline.mark("backward", timeline.COMPUTE, began)
            self._backward_began = 0
        self._armed = False
        self.transport.end_backward()
        if self._pump is not None:
            self._pump.stop()
            self._pump = None
        if self.static_graph and self._expected is None:
            for index in np.flatnonzero(self._fires):
                self._mark_ready(int(index), self.params[index])
            self._expected = self._fires.copy()
        missing = [i for i in range(len(self.params)) if not self._used[i]]
        if self.find_unused:
            for i in missing:
                if i not in self._where:
                    continue
                b, k = self._where[i]
                self.buckets[b].views[k].zero_()
                self.buckets[b].pending.discard(i)
            self._launch_ready()
            flags = np.append(self._used, np.uint8(bool(self._twice)))
        else:
            # Without find_unused_parameters, a rank that missed a gradient never launches
            # that bucket; the others would wait on it forever. Agree first.
            flags = np.array([bool(missing), bool(self._twice)], dtype=np.uint8)
        agreed = self.agree(flags, missing, self._twice, self.buckets)
        self._wait_and_copy(globally_used=agreed[:-1] if self.find_unused else None)
        self._reduce_sparse()
        self.schedule_rebuild()
        if self.timer is not None and began:
            self.timer(began)

    def _reduce_sparse(self) -> None:
        for index in self.sparse:
            param = self.params[index]
            grad = param.grad if self._used[index] else None
            param.grad = allreduce_sparse(self.comm, grad, param, self.sparse_divisor())

    def set_divisor(self, ranks: int) -> None:
        """Average over ``ranks`` from now on (Join's ``divide_by_initial_world_size=False``
        counts the ranks still training); a torch-style hook divides by itself."""
        if isinstance(self.hook, AllreduceMean):
            self.hook.divisor = ranks

    def sparse_divisor(self) -> int:
        """What a sparse gradient's sum is divided by."""
        # A torch-style hook never sees sparse gradients (torch reduces them apart too).
        return self.hook.divisor if isinstance(self.hook, AllreduceMean) else self.comm.size

    def agreement_flags(self) -> int:
        """How many flags the end-of-backward agreement carries (``agree``)."""
        return len(self.params) + 1 if self.find_unused else 2

    def agree(self, flags, missing, twice, buckets) -> np.ndarray:
        """The end-of-backward agreement on ``flags`` (``agreement.py``); where any rank
        got a gradient twice, or (without find_unused_parameters) none, complete every
        bucket of ``buckets`` so no request is left unmatched, then raise on every rank.
        Collective."""
        agreed = agree_on_flags(self.control, flags)
        if gone_wrong(agreed, self.find_unused):
            self._drain(missing, buckets)
            raise_what_went_wrong(self.control, self.names, agreed, missing, twice)
        return agreed

    def schedule_rebuild(self) -> None:
        """Lay the buckets out in the observed order at the next forward, once (after
        the first iteration)."""
        if self._ready_order is not None:
            self._rebuild_order, self._ready_order = self._ready_order, None

    def _wait_and_copy(self, globally_used) -> None:
        self.transport.issue_all()
        self.transport.complete_issued()
        for bucket in self.buckets:
            with timeline.span(f"wait bucket {bucket.index()}", timeline.REDUCER):
                bucket.finish()
            with timeline.span(f"copy back bucket {bucket.index()}", timeline.REDUCER):
                bucket.copy_back(self.as_view, globally_used)
            bucket.release()

    def _drain(self, missing, buckets) -> None:
        """Launch and complete every bucket so no request is left unmatched."""
        if buckets is self.buckets:
            for i in missing:
                self.buckets[self._where[i][0]].pending.discard(i)
            self._launch_ready()
        for bucket in buckets:
            if bucket.handle is not None:
                bucket.finish()

    def start_timing(self, timer: Callable[[int], None]) -> None:
        """Call ``timer`` with ``timeline.now()`` of each synchronized step's first gradient
        once the step's backward and communication are done (the autotuner's measure)."""
        self.timer = timer

    def stop_timing(self) -> None:
        """No more calls of the timer (the autotuner has chosen)."""
        self.timer = None

    def close(self) -> None:
        """Remove the autograd hooks and free what the transport made for itself.

        .. warning:: Collective where ``HPCDDP_DEBUG=detail`` (``Transport.close``).
        """
        self.remove_hooks()
        self.transport.close()

    def remove_hooks(self) -> None:
        """No more backward work: the autograd hooks removed, the progress pump stopped."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._pump is not None:
            self._pump.stop()
            self._pump = None
