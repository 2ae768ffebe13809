"""Random number generator state as tensors and plain values.

Saved like this, a checkpoint loads under torch's ``weights_only=True`` default, which
refuses the raw tuple ``np.random.get_state()`` returns.
"""

import random

import numpy as np
import torch

from hpcddp.env.notices import warn_user

__all__ = ["capture_rng", "numpy_state", "restore_rng", "reseed_rng", "set_numpy_state"]


def numpy_state(generator) -> dict:
    """A ``np.random.RandomState``'s (or the global one's) state as tensors and values."""
    kind, keys, pos, has_gauss, cached = generator.get_state()
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def set_numpy_state(generator, saved: dict) -> None:
    """Put back what ``numpy_state`` captured."""
    generator.set_state((saved["kind"], saved["keys"].cpu().numpy().astype(np.uint32),
                         saved["pos"], saved["has_gauss"], saved["cached_gaussian"]))


def capture_rng() -> dict:
    """This rank's Python, NumPy, torch CPU and CUDA generator states."""
    version, internal, gauss = random.getstate()
    state = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss": gauss},
        "numpy": numpy_state(np.random),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Put back what ``capture_rng`` saved.

    The state may arrive on a GPU (a checkpoint loaded with ``map_location`` set to the
    model's device); generator states are always set from host tensors.
    """
    state = _on_host(state)
    py = state["python"]
    random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss"]))
    set_numpy_state(np.random, state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)


def _on_host(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, dict):
        return {k: _on_host(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    return value


def reseed_rng(step: int, rank: int, saved_world_size: int, world_size: int) -> None:
    """Seed every generator from (step, rank): deterministic when states cannot be mapped."""
    seed = (step * 1_000_003 + rank) % (2 ** 31)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    warn_user(f"hpcddp.checkpoint: saved on {saved_world_size} ranks, resumed on {world_size}: "
              f"each rank's random generators are seeded from (step={step}, rank), since "
              f"per-rank states cannot be mapped to other ranks; training goes on correctly "
              f"but will not repeat an uninterrupted run bit for bit", rank=rank)
