"""torchrun's variables, given from MPI's facts.

Frameworks on top of torch (Hugging Face Accelerate and Trainer, Lightning, DeepSpeed,
many training scripts) decide whether a run is distributed, and which rank they are,
from the variables torchrun exports to each process. A job that ``mpiexec`` or ``srun``
started has none of them, so such a framework would see a single process. ``init()``
gives them the values torchrun would have: the rank and size from MPI, the local ones
from the ranks that share a node, the "group" (torchrun's agent, one per node) from the
node numbering. A value a launcher already set is kept where it agrees with MPI, and is
an error where it does not (a framework would train as another rank than MPI's).
"""

from typing import Dict, List, Mapping, MutableMapping

__all__ = ["TORCHRUN_VARIABLES", "disagreements", "export", "torchrun_values"]

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE")


def torchrun_values(rank: int, size: int, local_rank: int, local_size: int,
                    node_rank: int, num_nodes: int) -> Dict[str, str]:
    """What torchrun would export to this process, one agent per node, one role."""
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(node_rank),
            "GROUP_WORLD_SIZE": str(num_nodes), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(size)}


def disagreements(values: Mapping[str, str], environ: Mapping[str, str]) -> List[str]:
    """The variables ``environ`` already sets to something other than ``values``."""
    return [f"{name}={environ[name]} (set before hpcddp.init()) where MPI gives {value}"
            for name, value in values.items()
            if name in environ and environ[name].strip() != value]


def export(values: Mapping[str, str], environ: MutableMapping[str, str]) -> List[str]:
    """Set each of ``values`` that ``environ`` lacks; return the names set."""
    missing = [name for name in values if name not in environ]
    for name in missing:
        environ[name] = values[name]
    return missing
