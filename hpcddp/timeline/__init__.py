"""The timeline: what every rank did and when, as one Chrome trace that Perfetto opens.

``HPCDDP_TIMELINE=trace.json`` (or ``hpcddp.init(timeline=...)``) records spans on every
rank: forward, backward, each DDP bucket's launch, its reduction in MPI (from the moment
it is issued to the moment a ``Test`` or ``Wait`` sees it complete), the wait for it and
the copy back, the optimizer step and the waits for the loader. Clocks are aligned at a
barrier when recording starts. Events stay in memory (up to ``limit`` per rank; later ones
are counted, not kept) and are gathered to rank 0, which writes the file when hpcddp shuts
down (``hpcddp.shutdown()``, or at exit).

Off, a span costs one global lookup and returns a shared null context. The torch layer may
``mirror`` spans into ``torch.profiler`` traces (``record_function``), whether or not a
timeline is recorded, so both tools show hpcddp's communication. Standard library and
mpi4py only; the event format is documented by the Trace Event Format (``ph: "X"``
complete events, ``"M"`` metadata).
"""

import json
import os
import socket
import time
from contextlib import nullcontext
from typing import Callable, Optional

from hpcddp.comm import lifetime
from hpcddp.comm.outcome import share_outcome

__all__ = ["BUCKET_LANE", "COMPUTE", "LOADER", "REDUCER", "TORCH", "Timeline", "current", "mark",
           "mirror", "name_lane", "now", "recording", "span", "start"]

COMPUTE, REDUCER, LOADER, TORCH = 1, 2, 3, 4  # lanes (trace "threads") of each rank
BUCKET_LANE = 100  # DDP bucket b's reductions are lane 100 + b
_LANE_NAMES = {COMPUTE: "compute (forward, backward, optimizer)",
               REDUCER: "DDP reducer (launch, wait, copy back)", LOADER: "loader",
               TORCH: "torch.distributed"}

_NULL = nullcontext()
_recorder: Optional["Timeline"] = None
_profiler = None  # (is_profiling, record_function) from the torch layer

now = time.perf_counter_ns


def recording() -> bool:
    """Whether this rank is recording a timeline."""
    return _recorder is not None


def current() -> Optional["Timeline"]:
    """The timeline being recorded, or None."""
    return _recorder


def mirror(is_profiling: Callable[[], bool], record_function) -> None:
    """Also open ``record_function("hpcddp::<name>")`` for each span while
    ``is_profiling()`` (torch.profiler is running)."""
    global _profiler
    _profiler = (is_profiling, record_function)


class _Span:
    __slots__ = ("name", "lane", "args", "began", "inner")

    def __init__(self, name, lane, args, inner):
        self.name, self.lane, self.args, self.inner = name, lane, args, inner

    def __enter__(self):
        if self.inner is not None:
            self.inner.__enter__()
        self.began = now()
        return self

    def __exit__(self, *exc):
        ended = now()
        if _recorder is not None:
            _recorder.add(self.name, self.lane, self.began, ended, self.args)
        if self.inner is not None:
            self.inner.__exit__(*exc)


def span(name: str, lane: int, **args):
    """A context manager that records ``name`` on ``lane`` for the time it is open."""
    profiled = _profiler is not None and _profiler[0]()
    if _recorder is None and not profiled:
        return _NULL
    return _Span(name, lane, args or None,
                 _profiler[1](f"hpcddp::{name}") if profiled else None)


_named_lanes = {}  # lanes named by their users (name_lane)


def name_lane(lane: int, name: str) -> None:
    """Show ``lane`` as ``name`` in the trace (a lane of hpcddp.horovod's tensors)."""
    _named_lanes[lane] = name


def mark(name: str, lane: int, began: int, ended: Optional[int] = None, **args) -> None:
    """Record a span whose start (``now()`` then) was taken earlier, e.g. in another call."""
    if _recorder is not None:
        _recorder.add(name, lane, began, now() if ended is None else ended, args or None)


class Timeline:
    """The recording of one rank; ``close()`` (collective) writes the trace on rank 0.

    Args:
        path: the trace file to write (JSON, Trace Event Format).
        comm: every rank of the job; the clocks are aligned at a barrier on it.
        limit: events kept per rank.
    """

    def __init__(self, path: str, comm, limit: int = 1_000_000):
        self.path, self.comm, self.limit = os.fspath(path), comm, limit
        self.events, self.dropped, self.closed = [], 0, False
        comm.Barrier()
        self.origin = now()
        lifetime.register(self, keep_alive=True)  # written collectively before MPI ends

    def add(self, name, lane, began, ended, args) -> None:
        if len(self.events) < self.limit:
            self.events.append((name, lane, began, ended, args))
        else:
            self.dropped += 1

    def _trace_events(self) -> list:
        rank, origin = self.comm.rank, self.origin
        lanes = sorted({e[1] for e in self.events})
        out = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                "args": {"name": f"rank {rank} ({socket.gethostname()})"}},
               {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                "args": {"sort_index": rank}}]
        out += [{"ph": "M", "name": "thread_name", "pid": rank, "tid": lane,
                 "args": {"name": _LANE_NAMES.get(lane) or _named_lanes.get(lane)
                         or f"bucket {lane - BUCKET_LANE} reduction (MPI)"}}
                for lane in lanes]
        for name, lane, began, ended, args in self.events:
            event = {"name": name, "ph": "X", "pid": rank, "tid": lane,
                     "ts": (began - origin) / 1e3, "dur": max(ended - began, 0) / 1e3}
            if args:
                event["args"] = args
            out.append(event)
        return out

    def close(self) -> None:
        """Gather every rank's events to rank 0 and write the trace there.

        .. warning:: Collective.
        """
        global _recorder
        if self.closed:
            return
        self.closed = True
        lifetime.unregister(self)
        if _recorder is self:
            _recorder = None
        parts = self.comm.gather((self._trace_events(), self.dropped), root=0)
        if self.comm.rank != 0:
            return
        events = [e for part, _ in parts for e in part]
        dropped = sum(d for _, d in parts)
        temporary = f"{self.path}.tmp-{os.getpid()}"
        with open(temporary, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                       "otherData": {"producer": "hpcddp", "ranks": self.comm.size,
                                     "events_dropped": dropped}}, f)
        os.replace(temporary, self.path)


def start(path: str, comm, limit: int = 1_000_000) -> Timeline:
    """Start recording on every rank of ``comm``; the trace is written at shutdown.

    .. warning:: Collective (a barrier aligns the clocks).
    """
    global _recorder
    if _recorder is not None:
        raise RuntimeError(f"hpcddp: a timeline is already being recorded to "
                           f"{_recorder.path}")
    problem = None
    if comm.rank == 0:  # found now, on every rank, not when the run ends
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "a"):
                pass
        except OSError as error:
            problem = OSError(error.errno, f"the timeline cannot be written to {path} "
                              f"({error.strerror}); give HPCDDP_TIMELINE (or "
                              f"init(timeline=...)) a file in a writable directory")
    share_outcome(comm, problem, what="timeline file check")
    _recorder = Timeline(path, comm, limit)
    return _recorder
