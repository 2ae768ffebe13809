"""``hvd.elastic`` at the job's fixed size: Horovod's elastic scripts run unchanged.

An elastic script keeps its training state in a ``State`` (``TorchState``: a model, an
optimizer, an ``ElasticSampler`` and plain values), commits it now and then, and runs its
loop under ``@hvd.elastic.run``:

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

``run`` first makes every rank's state rank 0's (``sync``), then calls the function. A
``HostsUpdatedInterrupt`` raised in it (by the script: this job's hosts never change)
restarts the engine and the function after the state's reset callbacks, as Horovod does.
``commit()`` saves the state in memory and asks every rank, collectively, whether the
hosts changed; here they never have.

A ``HorovodInternalError`` (an operation that failed) restores the last commit. Where
the MPI has ULFM (Open MPI 5 under ``mpirun --with-ft ulfm``) and the failure is a rank
that died, the survivors go on in the same job, as Horovod's elastic mode does after
``horovodrun`` drops a host: hpcddp shrinks the job to them and rebuilds itself
(``hpcddp.elastic.recovery``), the engine starts again on the survivors (the global
process set only), the reset callbacks run, every rank takes the new rank 0's restored
state, and the function is called again; ``state.recoveries`` lists each recovery.
Elsewhere the error is raised: no rank leaves and comes back at a fixed size, so running
the function again would meet the same failure.
"""

import copy
import functools
import math
import numbers
import random
import time
from typing import Callable, Dict, List

import torch
from mpi4py import MPI

from hpcddp.elastic.recovery import recoverable, recovered, rejoin_survivors, until_recovered
from hpcddp.elastic.state import copy_into, fresh_copy
from hpcddp.faults.failed import armed_recovery
from hpcddp.horovod import basics
from hpcddp.horovod.common import HorovodInternalError, HostsUpdatedInterrupt
from hpcddp.horovod.functions import (broadcast_object, broadcast_optimizer_state,
                                      broadcast_parameters)

__all__ = ["ElasticSampler", "HorovodInternalError", "HostsUpdatedInterrupt",
           "ObjectState", "State", "TorchState", "run"]


class State:
    """State kept in memory on every rank between commits.

    Args:
        bcast_object: broadcasts a picklable value from rank 0 (``broadcast_object``).
        get_rank: this rank (``hvd.rank``).
    """

    def __init__(self, bcast_object: Callable, get_rank: Callable):
        self._bcast_object, self._rank = bcast_object, get_rank
        self._reset_callbacks: List[Callable] = []
        self._hosts_seen = 0  # the job's host list's version: never changes here
        self.commits = 0
        self.recoveries: List[dict] = []  # one report per recovery inside the job (ULFM)

    def register_reset_callbacks(self, callbacks) -> None:
        """Functions called after each reset (a worker added or removed)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state in memory, then ``check_host_updates()``.

        .. warning:: Collective.
        """
        self.save()
        self.commits += 1
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` on every rank if rank 0 has seen the hosts
        change since the last check; at a fixed size they never do.

        .. warning:: Collective (every rank takes rank 0's answer).
        """
        before, now = self._bcast_object((self._hosts_seen, self._hosts_seen))
        self._hosts_seen = now
        if now > before:
            raise HostsUpdatedInterrupt(False)

    def save(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Called on each reset, before the callbacks and the sync."""

    def values(self) -> Dict[str, object]:
        """The plain numbers and names kept (a recovery's report says them)."""
        return {}


class ObjectState(State):
    """Picklable values, given as keyword arguments and kept as attributes."""

    def __init__(self, bcast_object: Callable, get_rank: Callable, **kwargs):
        self._saved: Dict[str, object] = dict(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._saved}

    def restore(self) -> None:
        self._set_values()

    def sync(self) -> None:
        """Every rank takes rank 0's values. Collective."""
        if self._saved:
            self._saved = self._bcast_object(self._saved)
            self._set_values()

    def values(self) -> Dict[str, object]:
        return {name: value for name, value in self._saved.items()
                if isinstance(value, (numbers.Number, str))}

    def _set_values(self) -> None:
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))


class _Kept:
    """How ``TorchState`` saves, restores and syncs one kind of object: its state dict
    copied into the buffers of the save before (``hpcddp.elastic``'s commit)."""

    def __init__(self, value):
        self.value, self.saved = value, None
        self.save()

    def save(self):
        self.saved = copy_into(self.saved, self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(fresh_copy(self.saved))


class _Model(_Kept):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _Optimizer(_Kept):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _Sampler(_Kept):
    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict(), 0))


def _kept(value):
    if isinstance(value, torch.nn.Module):
        return _Model(value)
    if isinstance(value, torch.optim.Optimizer):
        return _Optimizer(value)
    if isinstance(value, ElasticSampler):
        return _Sampler(value)
    return None


class TorchState(ObjectState):
    """A model, an optimizer and other values (modules, optimizers and ``ElasticSampler``
    objects among them are kept by their state dicts; the rest as ``ObjectState``)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        objects = dict(kwargs)
        if model is not None:
            objects["model"] = model
        if optimizer is not None:
            objects["optimizer"] = optimizer
        handlers = {name: _kept(value) for name, value in objects.items()}
        self.__dict__["_handlers"] = {k: h for k, h in handlers.items() if h is not None}
        for name, handler in self._handlers.items():
            self.__dict__[name] = handler.value
        plain = {k: v for k, v in objects.items() if k not in self._handlers}
        super().__init__(broadcast_object, basics.rank, **plain)

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].value = value
        super().__setattr__(name, value)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        """Every rank takes rank 0's model, optimizer, samplers and values. Collective."""
        for handler in self._handlers.values():
            handler.sync()
        super().sync()


class ElasticSampler(torch.utils.data.Sampler):
    """``DistributedSampler``'s split that remembers how much of the epoch is done.

    Each epoch's order (shuffled by ``seed + epoch``) drops the samples already
    processed, pads to a multiple of the ranks, and gives rank ``r`` every ``size``-th
    sample from ``r``. ``record_batch`` counts a batch done on every rank; ``set_epoch``,
    called at an epoch's end, starts the next from its first sample; the count travels in
    ``state_dict`` (``TorchState`` commits and syncs it).

    >>> from types import SimpleNamespace
    >>> sampler = ElasticSampler(range(10), shuffle=False, world=SimpleNamespace(size=2, rank=1))
    >>> list(sampler)
    [1, 3, 5, 7, 9]
    >>> sampler.record_batch(0, 2); sampler.reset(); list(sampler)
    [5, 7, 9]
    """

    def __init__(self, dataset, shuffle: bool = True, seed: int = 0, world=None):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self._world = world  # a stand-in for the ranks in the doctest; hvd's by default
        self.epoch = 0
        self.processed_num = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """``batch_size`` samples done on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict) -> None:
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self) -> None:
        self.num_replicas = self._world.size if self._world else basics.size()
        self.rank = self._world.rank if self._world else basics.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        padded = list(self.remaining_indices)
        while padded and len(padded) < self.total_size:
            padded += padded[:self.total_size - len(padded)]
        return iter(padded[self.rank:self.total_size:self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples


def _restart_engine() -> None:
    basics.shutdown()
    basics.init()


def _recover(state: State, began: float) -> None:
    """One recovery attempt: each survivor back at its last commit, hpcddp and the
    engine rebuilt on the survivors. The reset callbacks and the sync follow in ``run``,
    where a rank that dies during them costs another recovery."""
    state.restore()
    basics.abandon()
    world, facts = rejoin_survivors()
    basics.init()
    recovered(world, facts, state.recoveries, state.commits, state.values(), began)


def _process_failure(error: BaseException) -> bool:
    return isinstance(error, (HorovodInternalError, MPI.Exception)) and recoverable(error)


def run(func: Callable) -> Callable:
    """Run ``func(state, ...)`` from rank 0's state; see the module's docstring."""

    @functools.wraps(func)
    def wrapper(state: State, *args, **kwargs):
        skip_sync = reset = False
        while True:
            try:
                with armed_recovery():
                    if reset:
                        state.on_reset()
                    if not skip_sync:
                        state.sync()
                    return func(state, *args, **kwargs)
            except HostsUpdatedInterrupt as interrupt:
                skip_sync = interrupt.skip_sync
                _restart_engine()
            except Exception as error:  # noqa: BLE001 - a rank's death is recovered from
                if not _process_failure(error):
                    if isinstance(error, HorovodInternalError):
                        state.restore()
                    raise
                began = time.monotonic()
                until_recovered(lambda: _recover(state, began))
                skip_sync = False
            reset = True
    return wrapper
