"""``State`` and ``run``: the training state of an elastic program, kept in memory.

A ``State`` holds objects kept by their state dicts (modules, a DDP model, optimizers,
schedulers, a ``ShardedLoader``, samplers: anything with ``state_dict`` and
``load_state_dict``) and plain values (``step``, ``epoch``, ...), read and written as its
attributes. ``commit()`` copies all of it, and each rank's random generators, into
buffers kept from the commit before (a copy of the bytes, no allocation once shapes
settle), ``restore()`` puts the last commit back, ``sync()`` makes every rank's state
the lowest rank's. Every ``checkpoint_every`` commits, ``commit()`` also saves the state
with ``hpcddp.checkpoint`` (atomic and verified), so a job that ends resumes from it.

``run(fn)`` wraps the training function: it resumes from the newest checkpoint, or
syncs, commits, and calls ``fn(state)``.
"""

import copy
import functools
import time
from typing import Any, Callable, Dict, List, Optional

import torch

from hpcddp import checkpoint
from hpcddp.checkpoint.rng import capture_rng, restore_rng
from hpcddp.comm import activity
from hpcddp.elastic.recovery import recover, recoverable, until_recovered
from hpcddp.faults.failed import armed_recovery
from hpcddp.runtime import get_world

__all__ = ["State", "copy_into", "fresh_copy", "run"]

_KEPT_BY_STATE_DICT = ("model", "optimizer", "scheduler", "loader")


def _kept(value) -> bool:
    return callable(getattr(value, "state_dict", None)) and \
        callable(getattr(value, "load_state_dict", None))


def copy_into(saved, current):
    """``current`` (a state dict: tensors in dicts, lists and tuples, and plain values)
    copied into ``saved``'s tensors where shapes, dtypes and devices match; new copies
    elsewhere. The result shares nothing with ``current``.

    >>> a = {"w": torch.zeros(2), "n": 1}
    >>> b = copy_into(None, a); b["w"] is a["w"], b["n"]
    (False, 1)
    >>> c = copy_into(b, {"w": torch.ones(2), "n": 2}); c["w"] is b["w"], c["w"].tolist()
    (True, [1.0, 1.0])
    """
    if isinstance(current, torch.Tensor):
        if isinstance(saved, torch.Tensor) and saved.shape == current.shape and \
                saved.dtype == current.dtype and saved.device == current.device:
            return saved.copy_(current.detach())
        return current.detach().clone()
    if isinstance(current, dict):
        old = saved if isinstance(saved, dict) else {}
        out = type(current)((k, copy_into(old.get(k), v)) for k, v in current.items())
        if hasattr(current, "_metadata"):  # a module's state dict carries its versions
            out._metadata = copy.deepcopy(current._metadata)
        return out
    if isinstance(current, (list, tuple)):
        old = saved if isinstance(saved, type(current)) and len(saved) == len(current) \
            else [None] * len(current)
        return type(current)(copy_into(s, v) for s, v in zip(old, current))
    return copy.deepcopy(current)


def fresh_copy(saved):
    """A copy of a commit to hand to ``load_state_dict`` (which may keep the tensors it is
    given, as an optimizer does: the commit must stay apart from the live state)."""
    return copy_into(None, saved)


class State:
    """The state an elastic program commits, restores and syncs.

    Args:
        model: a module or a DDP model (optional).
        optimizer: optional.
        scheduler, loader: optional, keyword only; ``loader`` a ``ShardedLoader`` (its
            position is kept) or any object with ``state_dict``/``load_state_dict``.
        checkpoint: a directory for ``hpcddp.checkpoint``; None: memory only.
        checkpoint_every: save a checkpoint every this many commits (0: never).
        values: plain values (``step=0, epoch=0``) or more objects with state dicts,
            kept under their names.

    Every attribute given is read and written as ``state.<name>``.
    """

    def __init__(self, model=None, optimizer=None, *, scheduler=None, loader=None,
                 checkpoint: Optional[str] = None, checkpoint_every: int = 0, **values):
        if checkpoint_every < 0 or (checkpoint_every and checkpoint is None):
            raise ValueError(f"hpcddp.elastic.State(checkpoint_every={checkpoint_every!r}):"
                             f" give a number of commits of 0 or more, with checkpoint="
                             f"<directory> when it is not 0")
        given = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
                 "loader": loader, **values}
        objects = {k: v for k, v in given.items() if v is not None and (
            k in _KEPT_BY_STATE_DICT or _kept(v))}
        for name, value in objects.items():
            if not _kept(value):
                raise TypeError(f"hpcddp.elastic.State({name}=...): a "
                                f"{type(value).__name__} has no state_dict() and "
                                f"load_state_dict(); give such an object or leave it out")
        self._objects = list(objects)
        self._values = [k for k in values if k not in objects]
        for name, value in given.items():
            if name in objects or name in self._values:
                setattr(self, name, value)
        self.checkpoint, self.checkpoint_every = checkpoint, checkpoint_every
        self.commits = 0
        self.resumed: Optional[checkpoint.Resumed] = None
        self.recoveries: List[dict] = []  # what each recovery inside the job did
        self._saved: Dict[str, Any] = {}
        self._reset_callbacks: List[Callable[[], None]] = []

    def values(self) -> Dict[str, Any]:
        """The plain values, by name."""
        return {name: getattr(self, name) for name in self._values}

    def register_reset_callbacks(self, callbacks) -> None:
        """Call each of ``callbacks`` (no arguments) after every recovery, once the state
        is restored and the world is the survivors' (``dist.get_world_size()`` is the new
        size): to scale a learning rate, say."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run the reset callbacks (``run`` does, after a recovery)."""
        for callback in self._reset_callbacks:
            callback()

    # -- in memory -------------------------------------------------------------------------

    def _snapshot(self) -> None:
        saved = self._saved
        for name in self._objects:
            saved[name] = copy_into(saved.get(name), getattr(self, name).state_dict())
        saved["values"] = {name: copy.deepcopy(getattr(self, name)) for name in self._values}
        saved["rng"] = copy_into(saved.get("rng"), capture_rng())

    def commit(self) -> None:
        """Keep the state as it is now; every ``checkpoint_every`` commits also save it.

        .. warning:: Collective where a checkpoint is saved (every rank commits alike).
        """
        with activity.named("hpcddp.elastic: commit"):
            self._snapshot()
        self.commits += 1
        if self.checkpoint_every and self.commits % self.checkpoint_every == 0:
            self.save_checkpoint()

    def restore(self) -> None:
        """Put the last commit back: objects, values and random generators."""
        if not self._saved:
            raise RuntimeError("hpcddp.elastic: restore() before any commit(); commit "
                               "first (run() commits before it calls the function)")
        for name in self._objects:
            getattr(self, name).load_state_dict(fresh_copy(self._saved[name]))
        for name, value in self._saved["values"].items():
            setattr(self, name, copy.deepcopy(value))
        restore_rng(self._saved["rng"])

    def sync(self, root: int = 0) -> None:
        """Make every rank's state rank ``root``'s (the random generators stay each
        rank's own), and commit it.

        .. warning:: Collective.
        """
        comm = get_world().comm
        self._snapshot()
        with activity.named("hpcddp.elastic: sync"):
            shared = comm.bcast({k: v for k, v in self._saved.items() if k != "rng"}
                                if comm.rank == root else None, root=root)
        if comm.rank != root:
            self._saved.update(shared)
        rng = self._saved["rng"]
        self.restore()
        self._saved["rng"] = rng

    def restore_newest(self) -> None:
        """Every rank's state the newest commit any rank holds (the lowest rank holding
        it gives it): after a failure, ranks' last commits may be a step apart.

        .. warning:: Collective.
        """
        self.restore()
        commits = get_world().comm.allgather(self.commits)
        newest = max(commits)
        self.sync(root=commits.index(newest))
        self.commits = newest

    # -- on disk ---------------------------------------------------------------------------

    def _extra(self) -> dict:
        others = [n for n in self._objects if n not in _KEPT_BY_STATE_DICT]
        return {"values": {n: getattr(self, n) for n in self._values},
                "objects": {n: getattr(self, n).state_dict() for n in others},
                "commits": self.commits}

    def save_checkpoint(self) -> str:
        """Save the state now with ``hpcddp.checkpoint`` under ``checkpoint`` (the newest
        three are kept). Collective."""
        values = {n: getattr(self, n) for n in self._values}
        return checkpoint.save(self.checkpoint, self._object("model"),
                               self._object("optimizer"), self._object("scheduler"),
                               loader=self._object("loader"),
                               step=int(values.get("step", self.commits)),
                               epoch=int(values.get("epoch", 0)), extra=self._extra(),
                               keep_last=3)

    def load_checkpoint(self) -> Optional[checkpoint.Resumed]:
        """Load the newest checkpoint under ``checkpoint`` into the state; None where
        there is none. Collective."""
        resumed = checkpoint.load(self.checkpoint, self._object("model"),
                                  self._object("optimizer"), self._object("scheduler"),
                                  loader=self._object("loader"))
        if resumed is not None:
            extra = resumed.extra or {}
            for name, value in extra.get("values", {}).items():
                if name in self._values:
                    setattr(self, name, value)
            for name, saved in extra.get("objects", {}).items():
                if name in self._objects:
                    getattr(self, name).load_state_dict(saved)
            self.commits = int(extra.get("commits", 0))
        self.resumed = resumed
        return resumed

    def _object(self, name):
        return getattr(self, name) if name in self._objects else None

    def __repr__(self) -> str:
        kept = ", ".join(self._objects + self._values)
        return f"hpcddp.elastic.State({kept}; {self.commits} commits)"


def run(fn: Callable) -> Callable:
    """Call ``fn(state, ...)`` from the newest checkpoint under ``state.checkpoint``, or,
    where there is none, from the lowest rank's state (``sync``), once it is committed.

    Where the MPI has ULFM (``mpirun --with-ft ulfm``), ranks that die while ``fn`` runs
    do not end the job: the survivors shrink it, restore the newest commit and call
    ``fn`` again (``hpcddp.elastic.recovery``); ``state.recoveries`` lists each time.

    .. warning:: Collective.
    """

    @functools.wraps(fn)
    def wrapper(state: State, *args, **kwargs):
        if state.checkpoint is None or state.load_checkpoint() is None:
            state.sync()
        state._snapshot()
        while True:
            try:
                with armed_recovery():
                    return fn(state, *args, **kwargs)
            except Exception as error:  # noqa: BLE001 - only a process failure is taken
                if not recoverable(error):
                    raise
            _recover_until_done(state)
    return wrapper


def _recover_until_done(state: State) -> None:
    began = time.monotonic()
    until_recovered(lambda: recover(state, began))
