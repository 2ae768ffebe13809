"""The ``HOROVOD_*`` settings a Horovod job may carry, and what each does here.

Read where they act (the engine, process sets, the timeline); this table is what
``hvd.init()`` checks a job's environment against, so a tuning variable that does
nothing on hpcddp is said once, with the reason, instead of silently ignored.
"""

import os
from typing import Dict, List, Mapping

__all__ = ["HONOURED", "WITHOUT_EFFECT", "number", "unheeded"]

HONOURED = {
    "HOROVOD_FUSION_THRESHOLD": "bytes fused into one allreduce (128 MiB)",
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "seconds before a name some ranks started is "
                                        "reported (60)",
    "HOROVOD_STALL_CHECK_DISABLE": "no stall reports",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "seconds before such a name ends the job (0: "
                                           "HPCDDP_TIMEOUT does)",
    "HOROVOD_DYNAMIC_PROCESS_SETS": "add_process_set and remove_process_set after init()",
    "HOROVOD_TIMELINE": "hpcddp's Chrome trace with a lane per tensor, written as the "
                        "job runs (DYNAMIC: from start_timeline())",
    "HOROVOD_TIMELINE_MARK_CYCLES": "a CYCLE_START moment per negotiation round",
    "HOROVOD_ELASTIC": "the optimizer's hooks also at one rank",
}

WITHOUT_EFFECT = {
    "HOROVOD_CYCLE_TIME": "the engine has no cycle: a name is decided as the last rank "
                          "asks for it",
    "HOROVOD_CACHE_CAPACITY": "every operation is negotiated; the negotiation is one "
                              "message each way",
    "HOROVOD_HIERARCHICAL_ALLREDUCE": "hpcddp chooses the reduction (HPCDDP_REDUCE)",
    "HOROVOD_HIERARCHICAL_ALLGATHER": "allgathers are MPI's",
    "HOROVOD_AUTOTUNE": "hpcddp.DistributedDataParallel(bucket_cap_mb='auto') tunes DDP",
    "HOROVOD_AUTOTUNE_LOG": "no autotuning of Horovod's settings",
    "HOROVOD_LOG_LEVEL": "hpcddp.horovod logs through logging ('hpcddp.horovod')",
    "HOROVOD_MPI_THREADS_DISABLE": "the engine's thread needs MPI_THREAD_SERIALIZED",
    "HOROVOD_GPU_OPERATIONS": "GPU tensors go through MPI (CUDA-aware or staged)",
    "HOROVOD_GPU_ALLREDUCE": "GPU tensors go through MPI (CUDA-aware or staged)",
    "HOROVOD_NUM_NCCL_STREAMS": "no NCCL",
}


def unheeded(environ: Mapping[str, str]) -> List[str]:
    """One line for each ``HOROVOD_*`` variable set in ``environ`` that does nothing here.

    >>> unheeded({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1", "HOME": "/"})
    ['HOROVOD_CYCLE_TIME=5 has no effect: the engine has no cycle: a name is decided as the last rank asks for it']
    """
    lines: List[str] = []
    for name in sorted(environ):
        if not name.startswith("HOROVOD_") or name in HONOURED:
            continue
        reason = WITHOUT_EFFECT.get(name, "hpcddp.horovod does not know it")
        lines.append(f"{name}={environ[name]} has no effect: {reason}")
    return lines



def number(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """A numeric ``HOROVOD_*`` setting; ``default`` where unset or empty. A value that is
    not a number is refused, naming it."""
    value = environ.get(name, "")
    try:
        return float(value) if value.strip() else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number; unset it or give one "
                         f"(default {default:g})") from None
