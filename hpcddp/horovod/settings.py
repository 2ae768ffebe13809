"""The ``HOROVOD_*`` settings a Horovod job may carry, and what each does here.

Read where they act (the engine, process sets, the timeline); this table is what
``hvd.init()`` checks a job's environment against, so a tuning variable that does
nothing on hpcddp is said once, with the reason, instead of silently ignored.
"""

import difflib
import logging
import os
from typing import Dict, List, Mapping

__all__ = ["HONOURED", "WITHOUT_EFFECT", "describe", "log_level", "number", "unheeded"]

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
    "HOROVOD_LOG_LEVEL": "the level of the 'hpcddp.horovod' logger (trace and debug: "
                         "DEBUG, ..., fatal: CRITICAL)",
    "HOROVOD_THREAD_AFFINITY": "pins hpcddp's MPI thread, which runs the engine, to this "
                               "local rank's core",
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
    "HOROVOD_MPI_THREADS_DISABLE": "the engine's thread needs MPI_THREAD_SERIALIZED",
    "HOROVOD_GPU_OPERATIONS": "GPU tensors go through MPI (CUDA-aware or staged)",
    "HOROVOD_GPU_ALLREDUCE": "GPU tensors go through MPI (CUDA-aware or staged)",
    "HOROVOD_NUM_NCCL_STREAMS": "no NCCL",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "no autotuning of Horovod's settings",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "no autotuning of Horovod's settings",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "no autotuning of Horovod's settings",
    "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE": "no autotuning of Horovod's settings",
    "HOROVOD_TORUS_ALLREDUCE": "hpcddp chooses the reduction (HPCDDP_REDUCE)",
    "HOROVOD_BATCH_D2D_MEMCOPIES": "fused tensors are copied by torch.cat",
    "HOROVOD_CPU_OPERATIONS": "every operation is MPI's",
    "HOROVOD_CONTROLLER": "the controller is MPI's",
    "HOROVOD_CCL_CACHE": "no oneCCL",
    "HOROVOD_GLOO_IFACE": "no Gloo: MPI chooses the network",
    "HOROVOD_GLOO_TIMEOUT_SECONDS": "no Gloo: HPCDDP_TIMEOUT bounds every wait",
    "HOROVOD_ADASUM_MPI_CHUNK_SIZE": "Adasum's values travel in one allgather",
    "HOROVOD_DISABLE_GROUP_FUSION": "groups are released whole and fused as ready",
    "HOROVOD_DISABLE_NVTX_RANGES": "no NVTX ranges",
    "HOROVOD_ENABLE_ASYNC_COMPLETION": "handles complete as their MPI requests do",
    "HOROVOD_ENABLE_XLA_OPS": "no XLA",
    "HOROVOD_START_TIMEOUT": "MPI's launcher starts the ranks; HPCDDP_TIMEOUT bounds "
                             "init()",
    "HOROVOD_ELASTIC_TIMEOUT": "a lost rank ends the job (no elastic recovery yet)",
    "HOROVOD_LOG_HIDE_TIME": "the logging module formats the records",
    "HOROVOD_HOSTNAME": "hpcddp takes each rank's node from MPI",
    "HOROVOD_RANK": "ranks come from MPI",
    "HOROVOD_SIZE": "ranks come from MPI",
    "HOROVOD_LOCAL_RANK": "ranks come from MPI",
    "HOROVOD_LOCAL_SIZE": "ranks come from MPI",
    "HOROVOD_CROSS_RANK": "ranks come from MPI",
    "HOROVOD_CROSS_SIZE": "ranks come from MPI",
}

_LOG_LEVELS = {"trace": logging.DEBUG, "debug": logging.DEBUG, "info": logging.INFO,
               "warning": logging.WARNING, "error": logging.ERROR, "fatal": logging.CRITICAL}


def unheeded(environ: Mapping[str, str]) -> List[str]:
    """One line for each ``HOROVOD_*`` variable set in ``environ`` that does nothing here;
    one Horovod does not know either is named with the nearest it does.

    >>> unheeded({"HOROVOD_CYCLE_TIME": "5", "HOROVOD_FUSION_THRESHOLD": "1", "HOME": "/"})
    ['HOROVOD_CYCLE_TIME=5 has no effect: the engine has no cycle: a name is decided as the last rank asks for it']
    >>> unheeded({"HOROVOD_FUSION_THRESHHOLD": "1"})
    ['HOROVOD_FUSION_THRESHHOLD=1 has no effect: no such setting; did you mean HOROVOD_FUSION_THRESHOLD?']
    """
    lines: List[str] = []
    for name in sorted(environ):
        if not name.startswith("HOROVOD_") or name in HONOURED:
            continue
        reason = WITHOUT_EFFECT.get(name) or _unknown(name)
        lines.append(f"{name}={environ[name]} has no effect: {reason}")
    return lines


def _unknown(name: str) -> str:
    near = difflib.get_close_matches(name, list(HONOURED) + list(WITHOUT_EFFECT), n=1,
                                     cutoff=0.8)
    return f"no such setting; did you mean {near[0]}?" if near else \
        "hpcddp.horovod does not know it"


def describe(environ: Mapping[str, str]) -> List[str]:
    """What each ``HOROVOD_*`` variable set in ``environ`` does here, for ``hpcddp
    doctor``: honoured ones with what they act on, the others as ``unheeded`` says.

    >>> describe({"HOROVOD_FUSION_THRESHOLD": "1048576"})
    ['HOROVOD_FUSION_THRESHOLD=1048576: bytes fused into one allreduce (128 MiB)']
    """
    honoured = [f"{name}={environ[name]}: {HONOURED[name]}" for name in sorted(environ)
                if name in HONOURED]
    return honoured + unheeded(environ)


def log_level(environ: Mapping[str, str] = os.environ) -> None:
    """Set the 'hpcddp.horovod' logger's level from ``HOROVOD_LOG_LEVEL``, as Horovod's
    levels read (trace, debug, info, warning, error, fatal); an unknown level is refused."""
    value = environ.get("HOROVOD_LOG_LEVEL", "").strip().lower()
    if not value:
        return
    if value not in _LOG_LEVELS:
        raise ValueError(f"HOROVOD_LOG_LEVEL={environ['HOROVOD_LOG_LEVEL']!r} is not one of "
                         f"{', '.join(_LOG_LEVELS)}")
    logging.getLogger("hpcddp.horovod").setLevel(_LOG_LEVELS[value])


def number(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """A numeric ``HOROVOD_*`` setting; ``default`` where unset or empty. A value that is
    not a number is refused, naming it."""
    value = environ.get(name, "")
    try:
        return float(value) if value.strip() else default
    except ValueError:
        raise ValueError(f"{name}={value!r} is not a number; unset it or give one "
                         f"(default {default:g})") from None
