"""``horovod.torch``'s helpers for starting every rank from the same state: parameters and
optimizer state from a root rank, any picklable object broadcast or gathered.

Example::

    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    epoch = hvd.broadcast_object(epoch, root_rank=0, name="epoch")
"""

import collections
import io
from typing import Any, List

import cloudpickle
import torch

from hpcddp.horovod import basics
from hpcddp.horovod.gather_ops import allgather, broadcast_, broadcast_async_
from hpcddp.horovod.mpi_ops import synchronize
from hpcddp.horovod.process_sets import global_process_set

__all__ = ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
           "allgather_object"]


def broadcast_parameters(params, root_rank: int, process_set=global_process_set) -> None:
    """Overwrite every rank's tensors with ``root_rank``'s, in place.

    ``params`` is a dict (``model.state_dict()``; broadcast in sorted key order, so every
    rank names them alike), or a list of tensors or of ``(name, tensor)`` pairs
    (``model.parameters()``, ``model.named_parameters()``).
    """
    if isinstance(params, dict):
        pairs = sorted(params.items())
    elif isinstance(params, list):
        pairs = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}; give a dict such as "
                         f"model.state_dict() or a list such as list(model.named_parameters())")
    handles = [broadcast_async_(tensor, root_rank, name, process_set)
               for name, tensor in pairs]
    for handle in handles:
        synchronize(handle)


def _initialised_state(optimizer) -> dict:
    """The optimizer's state dict; an optimizer that has not stepped yet steps once on zero
    gradients first (not synchronized: no rank waits for another), so that its state
    tensors exist on every rank to be overwritten."""
    state_dict = optimizer.state_dict()
    if state_dict["state"]:
        return state_dict
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    skip = getattr(optimizer, "skip_synchronize", None)
    if skip is not None:
        with skip():
            optimizer.step()
    else:
        optimizer.step()
    return optimizer.state_dict()


def broadcast_optimizer_state(optimizer, root_rank: int,
                              process_set=global_process_set) -> None:
    """Overwrite every rank's optimizer state and options (learning rate, betas, ...) with
    ``root_rank``'s: state tensors in place, everything else (scalars, options) as one
    pickled object. ``torch.optim.LBFGS`` is refused, as in Horovod."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state: its state is nested "
                         "history; broadcast_object(optimizer.state_dict()) and "
                         "load_state_dict it on the other ranks instead")
    state_dict = _initialised_state(optimizer)
    if not state_dict["state"]:
        return  # a stateless optimizer: its options are the only thing to agree on
    tensors: List[tuple] = []
    scalars, assign = {}, {}
    seen = collections.defaultdict(int)

    def set_option(index, key):
        return lambda value: optimizer.param_groups[index].__setitem__(key, value)

    def set_state(pid, key):
        return lambda value: state_dict["state"][pid].__setitem__(key, value)

    for index, group in enumerate(state_dict["param_groups"]):
        for key, value in group.items():
            if key != "params":
                scalars[f"{key}.{index}"] = value
                assign[f"{key}.{index}"] = set_option(index, key)
        for pid in group["params"]:
            for key, value in state_dict["state"].get(pid, {}).items():
                seen[key] += 1
                name = f"{key}.{seen[key]}"
                if torch.is_tensor(value):
                    tensors.append((name, value))
                else:
                    scalars[name] = value
                    assign[name] = set_state(pid, key)
    broadcast_parameters(tensors, root_rank, process_set)
    for name, value in broadcast_object(scalars, root_rank, "optimizer.scalars",
                                        process_set).items():
        assign[name](value)


def _pickled(obj) -> torch.Tensor:
    buffer = io.BytesIO()
    cloudpickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _unpickled(data) -> Any:
    return cloudpickle.loads(data.numpy().tobytes())


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=global_process_set):
    """``root_rank``'s ``obj`` (pickled with cloudpickle) on every rank of the set."""
    name = type(obj).__name__ if name is None else name
    root = basics.rank() == root_rank
    data = _pickled(obj) if root else None
    length = torch.tensor([data.numel() if root else 0], dtype=torch.int64)
    broadcast_(length, root_rank, f"{name}.sz", process_set)
    if not root:
        data = torch.empty(int(length), dtype=torch.uint8)
    broadcast_(data, root_rank, f"{name}.t", process_set)
    return obj if root else _unpickled(data)


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every rank's ``obj``, in rank order of the set."""
    name = type(obj).__name__ if name is None else name
    data = _pickled(obj)
    lengths = allgather(torch.tensor([data.numel()], dtype=torch.int64), f"{name}.sz",
                        process_set).tolist()
    gathered = allgather(data, f"{name}.t", process_set)
    return [_unpickled(part) for part in torch.split(gathered, lengths)]
