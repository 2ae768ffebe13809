"""Where a rank's torch thread count comes from, in the order torch users expect.

1. ``HPCDDP_NUM_THREADS`` (above 0);
2. ``OMP_NUM_THREADS``, what torch itself and every OpenMP program obey;
3. a count the script set with ``torch.set_num_threads`` before ``hpcddp.init()``;
4. else hpcddp's default: the cores of the rank's affinity mask, shared among the ranks
   of the node whose masks overlap it (torch's own default follows neither launcher: it
   differs between mpiexec and srun on the same node).

A count set with ``torch.set_num_threads`` is seen as the difference from the count
torch had when it was first imported (``import hpcddp`` notes it then, or at once if torch
was imported first, in which case a count set before ``import hpcddp`` looks like torch's
own). Standard library only: torch is passed in.
"""

from typing import Mapping, Optional, Tuple

__all__ = ["choose_threads", "note_torch_default", "torch_default"]

_noted: Optional[int] = None


def note_torch_default() -> None:
    """Note torch's thread count as it is right after torch's import."""
    global _noted
    import torch
    _noted = torch.get_num_threads()


def torch_default() -> Optional[int]:
    """The count noted at torch's import (None: not noted)."""
    return _noted


def _positive(text: Optional[str]) -> Optional[int]:
    try:
        value = int((text or "").strip())
    except ValueError:
        return None
    return value if value > 0 else None


def choose_threads(setting: int, environ: Mapping[str, str], current: int,
                   noted: Optional[int], cores: int) -> Tuple[int, str]:
    """The thread count and what decided it (for ``World.threads_reason`` and the doctor).

    Args:
        setting: ``HPCDDP_NUM_THREADS`` (0: unset).
        environ: the process environment (``OMP_NUM_THREADS``).
        current: ``torch.get_num_threads()`` now.
        noted: ``torch_default()``.
        cores: hpcddp's default, the rank's share of its cores.
    """
    if setting > 0:
        return setting, f"HPCDDP_NUM_THREADS={setting}"
    omp = _positive(environ.get("OMP_NUM_THREADS"))
    if omp is not None:
        return omp, f"OMP_NUM_THREADS={omp}"
    if noted is not None and current != noted:
        return current, f"torch.set_num_threads({current}) before hpcddp.init()"
    return cores, (f"the cores of this rank's affinity mask, shared among the ranks of the "
                   f"node that overlap it ({cores})")
