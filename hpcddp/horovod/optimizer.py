"""``hvd.DistributedOptimizer``: the user's optimizer, whose gradients are averaged over
the ranks as backward produces them.

Each parameter's gradient is submitted to the engine (``engine.py``) under the
parameter's name the moment autograd has accumulated it, so the reductions of the last
layers move while backward still computes the first; ``step()`` (or ``synchronize()``)
waits for them and puts the averages into ``.grad``. The wrapped object is an instance
of a subclass of the user's optimizer class: ``isinstance(opt, torch.optim.SGD)`` holds,
its state and parameter groups are the original's, and ``state_dict()`` is unchanged.

Example::

    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in loader:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
"""

import os
import warnings
from contextlib import contextmanager
from typing import Dict, List, Optional

import torch

from hpcddp.horovod import basics
from hpcddp.horovod.common import Adasum, Average
from hpcddp.horovod.compression import Compression
from hpcddp.horovod.functions import broadcast_object
from hpcddp.horovod.gather_ops import sparse_allreduce_async
from hpcddp.horovod.mpi_ops import allreduce_async_, grouped_allreduce_async_, synchronize
from hpcddp.horovod.process_sets import global_process_set

__all__ = ["DistributedOptimizer"]

_TOO_MANY_PASSES = ("Gradients were computed more than backward_passes_per_step times "
                    "before call to step(). Increase backward_passes_per_step to "
                    "accumulate gradients locally.")
_STEP_AFTER_SYNC = ("optimizer.step() called without optimizer.skip_synchronize() context "
                    "after optimizer.synchronize(). This can cause training slowdown. You "
                    "may want to consider using optimizer.skip_synchronize() context if "
                    "you use optimizer.synchronize() in your code.")
_ZERO_GRAD_PENDING = ("optimizer.zero_grad() was called after loss.backward() but before "
                      "optimizer.step() or optimizer.synchronize(). This is prohibited as "
                      "it can cause a race condition.")


def _split(items: list, parts: int) -> List[list]:
    """``items`` in ``parts`` consecutive runs whose lengths differ by at most one."""
    size, extra = divmod(len(items), parts)
    return [items[k * size + min(k, extra):(k + 1) * size + min(k + 1, extra)]
            for k in range(parts)]


class _Distributed:
    """The methods a wrapped optimizer adds to its class (first in its MRO)."""

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor, groups, sparse_as_dense, process_set):
        if named_parameters is not None:
            named_parameters = list(named_parameters)
        else:
            named_parameters = [(f"allreduce.noname.{i}.{j}", p)
                                for i, group in enumerate(self.param_groups)
                                for j, p in enumerate(group["params"])]
        if any(not isinstance(pair, tuple) for pair in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, "
                             "parameter), usually produced by model.named_parameters().")
        names = [name for name, _ in named_parameters]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError("Parameter names in named_parameters must be unique. Found "
                             f"duplicates: {', '.join(duplicates)}")
        named_ids = {id(p) for _, p in named_parameters}
        unnamed = [id(p) for group in self.param_groups for p in group["params"]
                   if id(p) not in named_ids]
        if unnamed:
            raise ValueError("named_parameters was specified, but one or more model "
                             "parameters were not named. Python object ids: "
                             f"{', '.join(str(i) for i in unnamed)}")
        self._parameter_names = {p: name for name, p in sorted(named_parameters,
                                                               key=lambda pair: pair[0])}
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self._allreduce_delay = {p: backward_passes_per_step for p in self._parameter_names}
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._groups = groups
        self._handles: Dict = {}
        self._hook_handles = []
        self._requires_update = set()
        self._synchronized = False
        self._should_synchronize = True
        self._p_to_group: Dict = {}
        self._group_counts: Dict = {}
        if op != Adasum and process_set.included() and (
                basics.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._register_hooks()

    # -- hooks -----------------------------------------------------------------------

    def _trained(self) -> list:
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def _form_groups(self, trained: list) -> None:
        # Every rank forms the same groups in the same order: rank 0's parameter order.
        order = broadcast_object([self._parameter_names[p] for p in trained], 0,
                                 "DistributedOptimizer.order", self.process_set)
        position = {name: k for k, name in enumerate(order)}
        trained = sorted(trained, key=lambda p: position[self._parameter_names[p]])
        if isinstance(self._groups, list):
            listed = [[p for p in group if any(p is q for q in trained)]
                      for group in self._groups]
            grouped = {id(p) for group in listed for p in group}
            runs = [group for group in listed if group]
            runs += [[p] for p in trained if id(p) not in grouped]
        else:
            runs = [run for run in _split(trained, self._groups) if run]
        for run in runs:
            run = tuple(run)
            for p in run:
                self._p_to_group[p] = run
            self._group_counts[run] = 0

    def _register_hooks(self) -> None:
        trained = self._trained()
        if self._groups is not None:
            self._form_groups(trained)
        for p in trained:
            self._requires_update.add(p)
            self._hook_handles.append(p.register_post_accumulate_grad_hook(self._hook))

    def _hook(self, p) -> None:
        if self._allreduce_delay[p] <= 0:  # its reduction has started already
            raise AssertionError(_TOO_MANY_PASSES)
        assert not p.grad.requires_grad
        self._allreduce_delay[p] -= 1
        handle, ctx = None, None
        if self._allreduce_delay[p] == 0:
            group = self._p_to_group.get(p)
            if group is not None:
                self._group_counts[group] += 1
                if self._group_counts[group] == len(group):
                    self._start_group(group)
                return
            handle, ctx = self._allreduce_grad_async(p)
        self._handles[p] = (handle, ctx)

    # -- reductions ------------------------------------------------------------------

    def _scale(self):
        if self.op == Average:
            # The engine divides by the set's size after postscaling, for op=Average.
            return 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        return 1.0, 1.0

    def _dense_grad(self, p) -> torch.Tensor:
        if p.grad is None:
            # Not computed here, but another rank's graph may have: send zeros.
            p.grad = torch.zeros_like(p)
        elif p.grad.is_sparse and self.sparse_as_dense:
            return p.grad.to_dense()  # .grad stays sparse (SparseAdam): the result goes back so
        return p.grad

    def _allreduce_grad_async(self, p):
        grad = self._dense_grad(p)
        name = self._parameter_names.get(p)
        if grad.is_sparse:
            return sparse_allreduce_async(grad, name, self.op, self.process_set), None
        compressed, ctx = self._compression.compress(grad)
        prescale, postscale = self._scale()
        handle = allreduce_async_(compressed, name=name, op=self.op, prescale_factor=prescale,
                                  postscale_factor=postscale, process_set=self.process_set)
        return handle, ctx

    def _start_group(self, group) -> None:
        pairs = [self._compression.compress(self._dense_grad(p)) for p in group]
        prescale, postscale = self._scale()
        handle = grouped_allreduce_async_(
            [c for c, _ in pairs], name=self._parameter_names[group[0]], op=self.op,
            prescale_factor=prescale, postscale_factor=postscale,
            process_set=self.process_set)
        self._handles[group] = (handle, [ctx for _, ctx in pairs])
        for p in group:
            self._handles.pop(p, None)
        self._group_counts[group] = 0

    def synchronize(self) -> None:
        """Wait for every gradient's reduction, starting those whose backward passes have
        not all run (or whose gradient this rank never computed), and write the results
        into ``.grad``."""
        if not self.process_set.included():
            self._synchronized = True
            return
        started = set()
        for key in self._handles:
            started.update(key if isinstance(key, tuple) else (key,))
        for p in sorted(self._requires_update - started, key=self._parameter_names.get):
            group = self._p_to_group.get(p)
            if group is None:
                self._handles[p] = self._allreduce_grad_async(p)
            elif group not in self._handles:
                self._start_group(group)
        for p, (handle, ctx) in list(self._handles.items()):
            if handle is None:
                self._handles[p] = self._allreduce_grad_async(p)
        for key, (handle, ctx) in self._handles.items():
            if isinstance(key, tuple):
                for p, output, one in zip(key, synchronize(handle), ctx):
                    self._allreduce_delay[p] = self.backward_passes_per_step
                    p.grad.set_(self._compression.decompress(output, one))
                continue
            output = handle() if callable(handle) else synchronize(handle)
            self._allreduce_delay[key] = self.backward_passes_per_step
            if key.grad.is_sparse:
                output = self._compression.decompress(output, ctx) if ctx is not None else output
                key.grad.zero_().add_(output if output.is_sparse else output.to_sparse())
            else:
                key.grad.set_(self._compression.decompress(output, ctx))
        self._handles.clear()
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """Within it, ``step()`` does not synchronize: for ``synchronize()`` called by hand
        first (to clip the averaged gradients, for example)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self.op == Adasum:
            return self._adasum_step(closure)
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn(_STEP_AFTER_SYNC)
            self.synchronize()
        self._synchronized = False
        return super().step(closure)

    def _adasum_step(self, closure):
        """``op=Adasum``: each rank steps on its own gradients, then every parameter moves
        by the Adasum of the ranks' moves (each parameter's own dot products), as
        Horovod's Adasum optimizer does; the gradients are not averaged first."""
        params = sorted((p for group in self.param_groups for p in group["params"]
                         if p.requires_grad), key=self._parameter_names.get)
        starts = [p.detach().clone() for p in params]
        loss = super().step(closure)
        if params and self.process_set.included():
            with torch.no_grad():
                moves = [p.detach() - start for p, start in zip(params, starts)]
                moved = synchronize(grouped_allreduce_async_(
                    moves, name=f"adasum.{self._parameter_names[params[0]]}", op=Adasum,
                    process_set=self.process_set))
                for p, start, move in zip(params, starts, moved):
                    p.copy_(start + move)
        return loss

    def zero_grad(self, set_to_none: bool = True):
        if self._handles:
            raise AssertionError(_ZERO_GRAD_PENDING)
        return super().zero_grad(set_to_none)

    def set_backward_passes_per_step(self, passes: int) -> None:
        self.backward_passes_per_step = passes
        for p in self._allreduce_delay:
            self._allreduce_delay[p] = passes

    def load_state_dict(self, state_dict) -> None:
        self._handles = {}
        self._synchronized = False
        self._should_synchronize = True
        self.set_backward_passes_per_step(self.backward_passes_per_step)
        super().load_state_dict(state_dict)


def _check_groups(groups, num_groups):
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be "
                      "removed in v0.23.0.", DeprecationWarning)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, list):
        for group in groups:
            if not isinstance(group, list):
                raise ValueError("groups should be a non-negative integer or a list of list "
                                 "of torch.Tensor.")
            if any(not isinstance(p, torch.Tensor) for p in group):
                raise ValueError("groups must consist of torch.Tensor.")
        return groups
    if not isinstance(groups, int) or groups < 0:
        raise ValueError("groups should be a non-negative integer or a list of list of "
                         "torch.Tensor.")
    return groups or None


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op=Average,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Optional[object] = None, sparse_as_dense: bool = False,
                         process_set=global_process_set):
    """Wrap ``optimizer`` so that ``step()`` applies the average over the ranks of the set
    of each gradient.

    ``named_parameters`` names each parameter for the matching across ranks (every
    parameter of the optimizer must be named; by default they are numbered);
    ``backward_passes_per_step`` accumulates that many backward passes locally before
    reducing; ``op`` is ``hvd.Average`` or ``hvd.Sum``; ``gradient_predivide_factor``
    divides before the sum and multiplies after it (``op=Average`` only); ``groups`` (a
    count, or lists of parameters) reduces each group's gradients in one fused operation
    once all of them are ready; sparse gradients are gathered, or reduced densely with
    ``sparse_as_dense=True``.
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    groups = _check_groups(groups, num_groups)
    if isinstance(optimizer, _Distributed):
        raise ValueError("the optimizer is already a hvd.DistributedOptimizer")
    base = type(optimizer)
    cls = type(base.__name__, (_Distributed, base), {"__module__": base.__module__})
    wrapped = cls.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)
    wrapped._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor, groups, sparse_as_dense, process_set)
    return wrapped
