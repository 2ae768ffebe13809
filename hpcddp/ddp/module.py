"""``hpcddp.DistributedDataParallel``: torch's DDP constructor and behaviour, on MPI."""

import warnings
from contextlib import contextmanager

from typing import Callable, List, Optional, Sequence

import torch
import torch.distributed as dist
from mpi4py import MPI
from torch import nn
from torch.distributed.algorithms.join import Join

from hpcddp import timeline
from hpcddp.backend.groups import comm_of
from hpcddp.comm import activity, lifetime
from hpcddp.ddp import hooks
from hpcddp.ddp.autotune import Autotuner, make_autotuner, wants_autotune
from hpcddp.ddp.buckets import DEFAULT_CAP_MB, FIRST_BUCKET_BYTES
from hpcddp.ddp.join import DDPJoinable, common_rank
from hpcddp.ddp.reducer import Reducer
from hpcddp.ddp.sparse import sparse_parameters
from hpcddp.ddp.stragglers import StragglerCheck
from hpcddp.ddp.sync import broadcast_tensors, verify_same_parameters
from hpcddp.env import get_setting
from hpcddp.runtime import get_world
from hpcddp.transport import Transport

__all__ = ["DistributedDataParallel"]

_warned_cpu_device_ids = []


def _resolve_comm(process_group, world):
    """The mpi4py communicator to train on: given, behind a torch group, or the world's."""
    if process_group is None:
        return world.comm
    if isinstance(process_group, MPI.Comm):
        return process_group
    return comm_of(process_group)


def _refuse(name, value, default):
    if value != default:
        raise NotImplementedError(
            f"hpcddp.DistributedDataParallel does not support {name}={value!r}; "
            f"leave it at {default!r} (torch's DDP features that hpcddp does not honour "
            f"are refused rather than ignored)")


class DistributedDataParallel(nn.Module, lifetime.Closable, DDPJoinable):
    """Data-parallel training over MPI, a drop-in for ``torch.nn.parallel.DistributedDataParallel``.

    Gradients are averaged across ranks in buckets with non-blocking ``Iallreduce``,
    overlapped with backward. Arguments, defaults and ``state_dict`` keys (``module.``
    prefix) are torch's.

    Args:
        module: the model, on this rank's device.
        device_ids: as torch's. On a machine without CUDA, CUDA indices are ignored
            with a one-time warning so one script runs everywhere.
        output_device: as torch's, and ignored in the same way without CUDA.
        dim: as torch's (kept for compatibility; inputs are not scattered).
        broadcast_buffers: broadcast buffers (e.g. BatchNorm statistics) from rank 0
            before each forward. ``None`` means True.
        init_sync: check that all ranks hold the same parameters, then broadcast
            parameters and buffers from rank 0.
        process_group: an mpi4py communicator or a group made after ``hpcddp.init()``;
            the hpcddp world by default.
        bucket_cap_mb: bucket size in MiB; ``None`` means 25, with a 1 MiB first bucket
            (as in torch, a given cap applies to the first bucket too). ``"auto"``:
            hpcddp measures bucket settings during the first steps and keeps the
            cheapest (``autotune.py``; ``HPCDDP_AUTOTUNE=1`` does it for any cap).
        find_unused_parameters: parameters may get no gradient in some iterations.
        check_reduction: deprecated in torch; accepted, no effect.
        gradient_as_bucket_view: ``.grad`` tensors are views into the buckets.
        static_graph: the set of used parameters never changes.
        forward_sync_buffers: overrides ``broadcast_buffers`` when given, as in torch.

    Example::

        world = hpcddp.init()
        model = hpcddp.DistributedDataParallel(Net().to(world.device))
        loss_fn(model(x), y).backward()   # .grad is the average over ranks
        optimizer.step()

    The wrapper owns two duplicated communicators; ``close()`` (or ``with``) frees them,
    and ``hpcddp.shutdown()`` closes wrappers still open. A job that builds many wrappers
    closes each one: MPI has a few thousand communicators at most.

    .. warning:: Construction and ``close()`` are collective. Every backward after a
       forward with ``require_backward_grad_sync`` (the default, see ``no_sync()``) is a
       synchronization point: all ranks must run it.
    """

    _what = "hpcddp.DistributedDataParallel"

    def __init__(self, module, device_ids=None, output_device=None, dim=0,
                 broadcast_buffers=None, init_sync=True, process_group=None,
                 bucket_cap_mb=None, find_unused_parameters=False, check_reduction=False,
                 gradient_as_bucket_view=False, static_graph=False,
                 delay_all_reduce_named_params=None, param_to_hook_all_reduce=None,
                 mixed_precision=None, device_mesh=None, skip_all_reduce_unused_params=False,
                 bucket_cap_mb_list=None, batched_grad_copy=False, forward_sync_buffers=None):
        super().__init__()
        DDPJoinable.__init__(self)
        for name, value, default in [
            ("delay_all_reduce_named_params", delay_all_reduce_named_params, None),
            ("param_to_hook_all_reduce", param_to_hook_all_reduce, None),
            ("mixed_precision", mixed_precision, None), ("device_mesh", device_mesh, None),
            ("skip_all_reduce_unused_params", skip_all_reduce_unused_params, False),
            ("bucket_cap_mb_list", bucket_cap_mb_list, None),
            ("batched_grad_copy", batched_grad_copy, False)]:
            _refuse(name, value, default)
        world = get_world()
        self.module = module
        self.dim = dim
        self.device_ids, self.output_device = self._check_devices(device_ids, output_device)
        self.forward_sync_buffers = (forward_sync_buffers if forward_sync_buffers is not None
                                     else broadcast_buffers is not False)
        self.broadcast_buffers = self.forward_sync_buffers
        self.find_unused_parameters = find_unused_parameters
        self.gradient_as_bucket_view = gradient_as_bucket_view
        self.static_graph = static_graph
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self._divide_by_initial_world_size = True
        self._pending = []  # this iteration's Join messages, completed before the next
        parent = _resolve_comm(process_group, world)
        self.process_group = process_group
        # Two private communicators: gradient data, and small control messages that
        # must never be matched against a pending bucket allreduce.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not named:
            raise RuntimeError("DistributedDataParallel got a module with no parameter that "
                               "requires a gradient; there is nothing to reduce")
        self._buffers_to_sync = [b for b in module.buffers()]
        tune = wants_autotune(bucket_cap_mb)
        given = None if bucket_cap_mb in (None, "auto") else bucket_cap_mb
        cap = DEFAULT_CAP_MB if given is None else given
        self._cap_bytes = int(cap * 1024 * 1024)
        self._given_cap, self._tune = given, tune
        self._connect(world, parent, named, init_sync)

    def _connect(self, world, parent, named, init_sync: bool) -> None:
        """The communicators, the control transport and the reducer on ``parent``.

        .. warning:: Collective over ``parent``.
        """
        module, given = self.module, self._given_cap
        self.tuner: Optional[Autotuner] = None
        self.reducer = None
        self._comm = parent.Dup()
        self._control = parent.Dup()
        # One channel for both: the watchdog numbers this model's collectives in the
        # order every rank issues them, buckets and control messages alike.
        activity.share(self._control, activity.channel_for(self._comm, "DDP model"))
        self._stragglers = StragglerCheck(self._control, get_setting("STRAGGLER_STEPS"))
        self._opened()
        try:
            self._control_transport = Transport(self._control, world.cuda_aware,
                                                reduction=world.reduction)
            if init_sync:
                verify_same_parameters(self._control, named,
                                       [(n, b) for n, b in module.named_buffers()])
                broadcast_tensors(self._control_transport, [p.detach() for _, p in named] +
                                  [b.detach() for b in self._buffers_to_sync])
            self.reducer = Reducer(named, self._comm, self._control, self._cap_bytes,
                                   find_unused_parameters=self.find_unused_parameters,
                                   static_graph=self.static_graph,
                                   gradient_as_bucket_view=self.gradient_as_bucket_view,
                                   cuda_aware=world.cuda_aware,
                                   progress_thread=get_setting("PROGRESS_THREAD"),
                                   staging_chunk_bytes=get_setting("STAGING_CHUNK_KB") << 10,
                                   reduction=world.reduction,
                                   first_cap_bytes=(FIRST_BUCKET_BYTES if given is None
                                                    else self._cap_bytes),
                                   solo_bytes=get_setting("SOLO_BUCKET_KB") << 10,
                                   sparse=sparse_parameters(module, [p for _, p in named]))
            if self._tune and self._comm.size > 1:
                self.tuner = make_autotuner(self.reducer, self._control, world)
        except BaseException:
            self.close()  # the checks raise on every rank, so this is collective too
            raise

    @property
    def bucket_bytes_cap(self) -> int:
        """The bucket cap in bytes (the one the autotuner chose, once it has)."""
        return self.reducer.cap_bytes if self.reducer is not None else self._cap_bytes

    @staticmethod
    def _check_devices(device_ids, output_device):
        if device_ids and not torch.cuda.is_available():
            if not _warned_cpu_device_ids:
                warnings.warn(f"hpcddp.DistributedDataParallel: device_ids={device_ids} "
                              f"ignored: CUDA is not available, training on the CPU",
                              stacklevel=3)
                _warned_cpu_device_ids.append(True)
            return None, None
        if device_ids is not None and len(device_ids) != 1:
            raise ValueError(f"device_ids={device_ids}: give one device per process, as "
                             f"torch's DDP requires (or None for a multi-device module)")
        if device_ids:
            output_device = device_ids[0] if output_device is None else output_device
        return device_ids, output_device

    def _move_inputs(self, inputs, kwargs):
        first = self.device_ids[0]
        device = torch.device(first) if isinstance(first, (str, torch.device)) \
            else torch.device("cuda", first)

        def move(obj):
            if isinstance(obj, torch.Tensor):
                return obj.to(device, non_blocking=True)
            if isinstance(obj, (list, tuple)):
                return type(obj)(move(o) for o in obj)
            if isinstance(obj, dict):
                return {k: move(v) for k, v in obj.items()}
            return obj
        return move(inputs), move(kwargs)

    def forward(self, *inputs, **kwargs):
        self._check_open()
        grad = torch.is_grad_enabled()
        self._complete_pending()
        # Under Join, the count of ranks still training comes first: a joined rank waits
        # for it before it mirrors anything else.
        notified = Join.notify_join_context(self)
        if notified is not None:
            self._pending.append(notified)
            self.reducer.set_divisor(self._comm.size if self._divide_by_initial_world_size
                                     else int(notified.result()[0].item()))
        sync, joinable = grad and self.require_backward_grad_sync, self._join_config.enable
        if sync and joinable and self.tuner is not None:
            self.tuner.pause()  # a rank that has joined runs no forward
        elif sync and not joinable:
            self.reducer.prepare_for_forward()
            if self.tuner is not None:
                self.tuner.before_forward()
            self._stragglers.step()
        self._sync_buffers(joined=False)
        if joinable:
            self._pending.append(self._agree_on_sync(sync, wait=False))
            if sync:  # after the agreement, from which a joined rank learns to mirror it
                self.reducer.prepare_for_forward()
        if self.device_ids:
            inputs, kwargs = self._move_inputs(inputs, kwargs)
        with timeline.span("forward", timeline.COMPUTE):
            output = self.module(*inputs, **kwargs)
        if grad:
            self.reducer.prepare_for_backward(self.require_backward_grad_sync)
        return output

    def _complete_pending(self) -> None:
        """Complete the last forward's Join messages."""
        for pending in self._pending:
            pending.wait()
        self._pending = []

    def _sync_buffers(self, joined: bool) -> None:
        """Broadcast buffers before forward: from rank 0, or under Join from the highest
        rank still training."""
        if not (self.forward_sync_buffers and self._buffers_to_sync and self._comm.size > 1):
            return
        root = common_rank(self._control, not joined) if self._join_config.enable else 0
        broadcast_tensors(self._control_transport, [b.detach() for b in self._buffers_to_sync],
                          root)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally, with no communication, inside this context.

        The first backward after it reduces the accumulated sum.

        Example::

            with model.no_sync():
                model(x1).sum().backward()
            model(x2).sum().backward()   # averages the sum of both gradients
        """
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous

    def register_comm_hook(self, state: object, hook: Callable) -> None:
        """Reduce each bucket with ``hook(state, bucket)`` instead of the default mean.

        The contract is torch's: ``bucket`` offers ``buffer()``, ``index()``,
        ``is_last()``, ``parameters()``, ``gradients()`` and ``set_buffer()``, and the hook
        returns a ``torch.futures.Future`` of the reduced flat tensor; gradients reach it
        undivided. torch's own hooks (``default_hooks``, PowerSGD, post-local SGD) run
        unchanged on the hpcddp torch.distributed group. ``hpcddp.fp16_compress_hook`` and
        ``hpcddp.bf16_compress_hook`` (with ``state=None``) compress inside hpcddp's
        transport instead, with no Python callback per bucket.

        The collectives a hook starts are issued during backward; futures are completed
        at the end of backward, bucket by bucket, so collectives chained with
        ``.then()`` are issued in the same order on every rank.

        Example::

            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1)
            model.register_comm_hook(state, psgd.powerSGD_hook)
            model.register_comm_hook(None, hpcddp.fp16_compress_hook)  # or this
        """
        self._check_open()
        self.reducer.set_comm_hook(state, hook)
        if self.tuner is not None and isinstance(self.reducer.hook, hooks.FutureHook):
            self.tuner.stop("a comm hook with torch's contract keeps state per bucket "
                            "(PowerSGD's error feedback), so buckets must not change")

    def _register_builtin_comm_hook(self, comm_hook_type) -> None:
        """torch's built-in hooks by type: ``ALLREDUCE`` or ``FP16_COMPRESS``."""
        builtin = {dist.BuiltinCommHookType.ALLREDUCE: hooks.allreduce_hook,
                   dist.BuiltinCommHookType.FP16_COMPRESS: hooks.fp16_compress_hook}
        if comm_hook_type not in builtin:
            raise ValueError(f"unknown built-in comm hook {comm_hook_type!r}")
        self.reducer.set_comm_hook(None, builtin[comm_hook_type])

    def bucket_order(self) -> List[int]:
        """Parameter indices (of ``module.parameters()`` that require grad) in bucket order.

        Saved by ``hpcddp.checkpoint`` so a resumed run reduces in the same order as an
        uninterrupted one.
        """
        return self.reducer.bucket_order()

    @property
    def comm_hook_state(self):
        """The state object of the registered comm hook (None without one), which
        ``hpcddp.checkpoint`` saves and restores."""
        return self.reducer.hook_state

    def autotune_state(self) -> Optional[dict]:
        """The bucket setting ``bucket_cap_mb="auto"`` chose and what it was measured on,
        for ``hpcddp.checkpoint``; None without autotuning or while it searches."""
        return self.tuner.state() if self.tuner is not None else None

    def load_autotune_state(self, state: Optional[dict]) -> bool:
        """Take a choice saved by ``autotune_state()`` if it was made on the same world,
        network and model, instead of searching; return whether it was taken.

        .. warning:: Collective.
        """
        return self.tuner.load_state(state) if self.tuner is not None else False

    def rebuild_buckets(self, order: Sequence[int]) -> bool:
        """Lay the buckets out for ``order`` (from ``bucket_order()``); return False, and
        change nothing, when ``order`` does not name each parameter exactly once."""
        if sorted(order) != sorted(self.reducer.bucket_order()):
            return False
        self.reducer.rebuild(order)
        return True

    def _abandon(self) -> None:
        # A rank died: nothing pending completes; the autograd hooks go with the reducer.
        self._pending = []
        if self.reducer is not None:
            self.reducer.remove_hooks()
        self.reducer = self._control_transport = self.tuner = None

    def _rejoin(self, world) -> None:
        """Train on ``world`` (the survivors, after ``hpcddp.elastic`` shrank the job):
        new communicators, transport and buckets; the parameters are the caller's to
        make equal (``State.sync``).

        .. warning:: Collective over the new world.
        """
        if self.process_group is not None:
            raise RuntimeError("hpcddp.elastic: a DistributedDataParallel on a process "
                               "group of its own cannot follow the job as it shrinks; leave "
                               "process_group unset to train on the world")
        named = [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]
        self._connect(world, world.comm, named, init_sync=False)

    def _release(self) -> None:
        self._complete_pending()
        if self.reducer is not None:
            self.reducer.close()
        if getattr(self, "_control_transport", None) is not None:
            self._control_transport.close()
        for comm in (self._comm, self._control):
            lifetime.free_comm(comm)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getstate__(self):
        raise TypeError("hpcddp.DistributedDataParallel holds MPI communicators and cannot "
                        "be pickled; save model.module.state_dict() instead")
