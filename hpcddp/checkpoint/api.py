"""``save`` and ``load``: collective, rank 0 touches the file system, everyone agrees."""

import io
import os
from typing import Any, NamedTuple, Optional

import torch
from mpi4py import MPI
from torch import nn

from hpcddp.checkpoint import store
from hpcddp.checkpoint.delivery import FileMappings, deliver
from hpcddp.checkpoint.hook_state import capture_hook_state, restore_hook_state
from hpcddp.checkpoint.rng import capture_rng, reseed_rng, restore_rng
from hpcddp.comm import activity
from hpcddp.comm.outcome import share_outcome
from hpcddp.ddp import DistributedDataParallel
from hpcddp.runtime import current_world, get_world

__all__ = ["DamagedCheckpointsError", "Resumed", "load", "load_model_state", "save"]


class Resumed(NamedTuple):
    """What ``load`` found: where to continue from."""

    path: str
    step: int
    epoch: int
    extra: Any


def _comm(comm):
    return comm if comm is not None else get_world().comm


def _node_of(comm):
    """The world's node communicator when ``comm`` is the world's (made once, at init);
    None lets the caller make one."""
    world = current_world()
    return world.local_comm if world is not None and comm is world.comm else None


def _unwrap(model: nn.Module) -> nn.Module:
    if isinstance(model, (DistributedDataParallel, nn.parallel.DistributedDataParallel)):
        return model.module
    return model


def _bucketed(model):
    """The hpcddp DDP wrapper whose bucket order a checkpoint keeps, or None."""
    return model if isinstance(model, DistributedDataParallel) else None


def _agree(comm, outcome):
    """Rank 0's outcome on every rank, raised everywhere if an error; the other ranks
    sleep meanwhile, leaving their cores to rank 0, which writes or reads for all."""
    return share_outcome(comm, outcome, root=0, patient=True, what="checkpoint agreement")


def save(directory, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
         loader=None, step: int = 0, epoch: int = 0, extra: Any = None,
         keep_last: Optional[int] = None, comm=None) -> str:
    """Save a checkpoint of the training state under ``directory``; return its path.

    Rank 0 writes it under a temporary name, fsyncs, renames it into place and updates
    ``latest``; per-rank random states are gathered to it first. No rank returns before
    the checkpoint is published, and an error on rank 0 (a full disk, a permission) is
    raised on every rank, with the previous checkpoint intact.

    Args:
        directory: where checkpoints live (``step-<step>`` directories and ``latest``).
        model: the model, wrapped in a DDP or not (saved without the ``module.`` prefix).
        optimizer: optional; its ``state_dict()`` is saved.
        scheduler: optional; its ``state_dict()`` is saved.
        scaler: optional; its ``state_dict()`` is saved.
        loader: a ``ShardedLoader``; its position is saved.
        step: where training is.
        epoch: where training is.
        extra: anything else that loads under ``torch.load(weights_only=True)``.
        keep_last: keep only this many newest checkpoints (after publishing).
        comm: defaults to the hpcddp world.

    Example::

        hpcddp.checkpoint.save("ckpt", model, optimizer, loader=loader, step=step,
                               epoch=epoch, keep_last=3)

    .. warning:: Collective and a synchronization point.
    """
    comm = _comm(comm)
    with activity.named("checkpoint.save: gathering random states"):
        rngs = comm.gather(capture_rng(), root=0)
    ddp = _bucketed(model)
    with activity.named("checkpoint.save: gathering comm hook states"):
        hooks = comm.gather(capture_hook_state(ddp.comm_hook_state) if ddp else None,
                            root=0)
    if comm.rank != 0:
        return _agree(comm, None)
    outcome: Any
    try:
        _check_loadable(extra)
        state = {
            "format": store.FORMAT, "step": int(step), "epoch": int(epoch),
            "world_size": comm.size, "model": _unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "scaler": scaler.state_dict() if scaler is not None else None,
            "loader": loader.state_dict() if loader is not None else None,
            "bucket_order": _bucketed(model).bucket_order() if _bucketed(model) else None,
            "autotune": _bucketed(model).autotune_state() if _bucketed(model) else None,
            "rng": rngs, "extra": extra,
            "comm_hook": hooks if any(h is not None for h in hooks) else None,
        }
        store.remove_stale_temporaries(directory)
        outcome = store.write_checkpoint(directory, int(step), state, comm.size)
        if keep_last:
            store.remove_old(directory, keep_last, keep=outcome)
    except Exception as error:  # noqa: BLE001 - raised on every rank below
        outcome = error
    return _agree(comm, outcome)


def _check_loadable(extra) -> None:
    """Refuse, before anything is written, an ``extra`` that ``load`` could not read back
    (``torch.load(weights_only=True)`` takes tensors, containers and plain values only)."""
    if extra is None:
        return
    buffer = io.BytesIO()
    torch.save(extra, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except Exception as error:  # noqa: BLE001 - reported with the fix
        reason = str(error).strip().splitlines()[-1] if str(error).strip() else repr(error)
        raise ValueError(
            f"hpcddp.checkpoint.save: extra={type(extra).__name__} would save but never load: "
            f"torch.load(weights_only=True) refuses it ({reason}). Keep extra to tensors, "
            f"dicts, lists, tuples, numbers, strings and bools: e.g. torch.from_numpy(array) "
            f"for a NumPy array. Nothing was written.") from None


class DamagedCheckpointsError(RuntimeError):
    """There are checkpoints to resume from, and every one of them is damaged."""


def _nothing_good(directory, skipped, allow_damaged):
    """Rank 0's outcome when no checkpoint is good: None, or the error to raise."""
    if not skipped or allow_damaged:
        return None
    return DamagedCheckpointsError(
        f"hpcddp.checkpoint.load: every checkpoint under {directory} is damaged, so there is "
        f"nothing to resume from and nothing was loaded: {'; '.join(skipped)}. Starting from "
        f"step 0 would silently discard the run; repair or move them away, or pass "
        f"load(..., allow_damaged=True) to start afresh (load then returns None)")


def _receive_verified(comm, directory, device, allow_damaged=False):
    """Rank 0 offers checkpoints newest first; every rank deserializes the broadcast bytes
    while rank 0 checks the hash. Returns ``(path, state)`` of the first good one, or None
    when there is none (an error when there were some, all damaged).

    .. warning:: Collective; every rank loops in step with rank 0's offers.
    """
    skipped = []
    offers = None
    if comm.rank == 0:
        store.remove_stale_temporaries(directory, saving=False)
        offers = store.open_candidates(directory, skipped)
    while True:
        opened = None
        if comm.rank == 0:
            try:
                opened = next(offers, None)
                header = _nothing_good(directory, skipped, allow_damaged) if opened is None \
                    else (opened.path, opened.size)
            except Exception as error:  # noqa: BLE001 - raised on every rank
                header = error
        header = _agree(comm, header if comm.rank == 0 else None)
        if header is None:
            return None
        path, size = header
        with activity.named(f"checkpoint.load: broadcast of {path}"):
            delivered = deliver(comm, opened, os.path.join(path, store.STATE), size,
                                _node_of(comm))
        try:
            state = delivered.load(device)
        except Exception as error:  # noqa: BLE001 - decided together below
            state = error
        good = _agree(comm, opened.verified() if opened else None)
        # Every rank has mapped the bytes by now: the node's copy may go.
        delivered.close()
        if opened:
            opened.close()
        if good:
            # The bytes are what was published: a failure to read them is everyone's.
            with activity.named("checkpoint.load: agreement on deserializing"):
                failed = comm.allreduce(isinstance(state, Exception), op=MPI.LOR)
            if failed:
                raise state if isinstance(state, Exception) else RuntimeError(
                    f"{path}: another rank could not deserialize the checkpoint")
            return path, state
        if comm.rank == 0:
            store.skip(path, f"{store.STATE} does not match its {opened.algorithm} digest in "
                       f"the manifest", skipped)


def _private(obj, copied=lambda tensor: None):
    """``obj`` with every tensor in it cloned (dicts, lists and tuples followed);
    ``copied(tensor)`` is called after each tensor's clone is made."""
    if isinstance(obj, torch.Tensor):
        clone = obj.clone()
        copied(obj)
        return clone
    if isinstance(obj, dict):
        return type(obj)((k, _private(v, copied)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_private(v, copied) for v in obj)
    return obj


def load_model_state(model: nn.Module, saved: dict) -> None:
    """Load a model state dict with or without the ``module.`` prefix into any model.

    ``model`` may be a bare module, torch's DDP or hpcddp's; ``saved`` may come from any
    of them.

    Raises:
        KeyError, ValueError: naming the first key or shape that differs.
    """
    target = _unwrap(model)
    expected = target.state_dict()
    if saved and all(k.startswith("module.") for k in saved) and \
            not any(k.startswith("module.") for k in expected):
        saved = {k[len("module."):]: v for k, v in saved.items()}
    for key, value in expected.items():
        if key not in saved:
            raise KeyError(f"checkpoint does not match the model: no entry for {key!r}")
        if tuple(saved[key].shape) != tuple(value.shape):
            raise ValueError(f"checkpoint does not match the model: {key!r} has shape "
                             f"{list(saved[key].shape)} in the checkpoint and "
                             f"{list(value.shape)} in the model")
    unexpected = [k for k in saved if k not in expected]
    if unexpected:
        raise KeyError(f"checkpoint does not match the model: unexpected entry "
                       f"{unexpected[0]!r}")
    target.load_state_dict(saved)


def load(directory, model: nn.Module, optimizer=None, scheduler=None, scaler=None,
         loader=None, comm=None, device=None, allow_damaged: bool = False,
         check_writable: bool = True) -> Optional[Resumed]:
    """Resume from the newest valid checkpoint under ``directory``.

    Rank 0 verifies checkpoints newest first against their manifests (size and digest),
    skipping a corrupt or partial one with a warning, reads the first good one and
    broadcasts it once per node; ranks on its node map rank 0's open file, and ranks on
    other nodes never touch the file system. Tensors are loaded on
    the host (or ``device``) and copied into place by each object's ``load_state_dict``,
    so optimizer state follows its parameters exactly as after ``torch.load(...,
    map_location="cpu")`` (Adam's ``step`` stays on the host, as in an unbroken run).
    State dicts with or without the ``module.`` prefix load either way.

    Before anything is read, rank 0 checks that ``directory`` can take a checkpoint
    (creating it if need be), so a script that loads and later saves there learns of a
    directory it cannot write before training, not at its first save.

    Args:
        allow_damaged: when every checkpoint there is damaged, return None (start
            afresh) instead of raising.
        check_writable: set False to resume from a directory that will not be saved to
            (a read-only copy).

    Returns:
        ``Resumed(path, step, epoch, extra)``, or None when there is nothing to resume,
        so one script either starts fresh or continues.

    Raises:
        KeyError, ValueError: on every rank, naming the first key or shape where the
            checkpoint and the model differ.
        DamagedCheckpointsError: on every rank, when there are checkpoints and every one
            is damaged (unless ``allow_damaged``); each is named with what is wrong.
        OSError: on every rank, when ``directory`` cannot be written (unless
            ``check_writable`` is False); nothing in it is touched.

    .. warning:: Collective.
    """
    comm = _comm(comm)
    if check_writable:
        outcome = None
        if comm.rank == 0:
            try:
                store.check_writable(directory)
            except OSError as error:
                outcome = error
        _agree(comm, outcome)
    found = _receive_verified(comm, directory, device or "cpu", allow_damaged)
    if found is None:
        return None
    path, state = found
    mapped = FileMappings()
    load_model_state(model, state["model"])  # copied into the model's own storage
    mapped.let_go(state["model"])
    # The rest is kept as loaded (optimizer moments, extra): off the mapped file, into
    # private memory now, rather than copied a page at a time on its first write; each
    # tensor's mapped pages are given back once it is copied.
    state = {key: value if key == "model" else _private(value, mapped.let_go)
             for key, value in state.items()}
    for obj, key in ((optimizer, "optimizer"), (scheduler, "scheduler"), (scaler, "scaler"),
                     (loader, "loader")):
        if obj is not None and state.get(key) is not None:
            obj.load_state_dict(state[key])
    order = state.get("bucket_order")
    if order is not None and _bucketed(model):
        _bucketed(model).rebuild_buckets(order)
    if _bucketed(model):
        _bucketed(model).load_autotune_state(state.get("autotune"))
    hooks = state.get("comm_hook")
    if hooks is not None and _bucketed(model):
        same = state["world_size"] == comm.size
        restore_hook_state(_bucketed(model).comm_hook_state,
                           hooks[comm.rank if same else 0], same, comm.rank)
    if state["world_size"] == comm.size:
        restore_rng(state["rng"][comm.rank])
    else:
        reseed_rng(state["step"], comm.rank, state["world_size"], comm.size)
    return Resumed(path, state["step"], state["epoch"], state["extra"])
