"""The timeline: what every rank did and when, as one Chrome trace that Perfetto opens.

``HPCDDP_TIMELINE=trace.json`` (or ``hpcddp.init(timeline=...)``) records spans on every
rank: forward, backward, each DDP bucket's launch, its reduction in MPI (from the moment
it is issued to the moment a ``Test`` or ``Wait`` sees it complete), the wait for it and
the copy back, the optimizer step and the waits for the loader. Clocks are aligned at a
barrier when recording starts. Rank 0 writes its own events into the file as the job
runs (a thread of its own writes what was recorded every 20 ms), as a JSON array left
open (the Trace Event Format lets a reader take an array without its closing bracket,
and ``read_events`` does), so the file can be read while the job runs. Every rank also keeps its events in memory (up to ``limit``; later ones are
counted, not kept); when hpcddp shuts down (``hpcddp.shutdown()``, or at exit) they are
gathered to rank 0, which replaces the file by the whole trace of every rank at once.

Off, a span costs one global lookup and returns a shared null context. The torch layer may
``mirror`` spans into ``torch.profiler`` traces (``record_function``), whether or not a
timeline is recorded, so both tools show hpcddp's communication. Standard library and
mpi4py only; the event format is documented by the Trace Event Format (``ph: "X"``
complete events, ``"M"`` metadata).
"""

import json
import os
import socket
import threading
import time
import warnings
from contextlib import nullcontext
from typing import Callable, Optional

from hpcddp.comm import lifetime
from hpcddp.comm.outcome import share_outcome

__all__ = ["BUCKET_LANE", "COMPUTE", "LOADER", "REDUCER", "TORCH", "Timeline", "current",
           "instant", "mark", "mirror", "name_lane", "now", "read_events", "recording", "span",
           "start"]

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


def instant(name: str, lane: int, **args) -> None:
    """Record a moment (an instant event, ``ph: "i"``) on ``lane``."""
    if _recorder is not None:
        _recorder.add(name, lane, now(), None, args or None)


def read_events(path) -> list:
    """The events of a trace file: a whole trace (``{"traceEvents": [...]}``) or the
    array rank 0 is still writing (no closing bracket, perhaps a last line cut short).
    """
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        return json.loads(text)["traceEvents"]
    lines = text.splitlines()[1:]  # the opening "["
    events = []
    for line in lines:
        line = line.rstrip().rstrip(",")
        if line in ("", "]"):
            continue
        try:
            events.append(json.loads(line))
        except ValueError:  # the line being written
            break
    return events


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
        self.origin, self.began_unix_us = now(), time.time_ns() // 1000
        self._writer = _Writer(self) if comm.rank == 0 else None
        lifetime.register(self, keep_alive=True)  # written collectively before MPI ends

    def add(self, name, lane, began, ended, args) -> None:
        if len(self.events) < self.limit:
            self.events.append((name, lane, began, ended, args))
        else:
            self.dropped += 1

    def _process_events(self) -> list:
        rank = self.comm.rank
        return [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                 "args": {"name": f"rank {rank} ({socket.gethostname()})",
                          "start_time_since_epoch_in_micros": self.began_unix_us}},
                {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                 "args": {"sort_index": rank}}]

    def _lane_event(self, lane) -> dict:
        return {"ph": "M", "name": "thread_name", "pid": self.comm.rank, "tid": lane,
                "args": {"name": _LANE_NAMES.get(lane) or _named_lanes.get(lane)
                         or f"bucket {lane - BUCKET_LANE} reduction (MPI)"}}

    def _event(self, name, lane, began, ended, args) -> dict:
        event = {"name": name, "ph": "X", "pid": self.comm.rank, "tid": lane,
                 "ts": (began - self.origin) / 1e3}
        if ended is None:
            event["ph"], event["s"] = "i", "t"
        else:
            event["dur"] = max(ended - began, 0) / 1e3
        if args:
            event["args"] = args
        return event

    def _trace_events(self) -> list:
        out = self._process_events()
        out += [self._lane_event(lane) for lane in sorted({e[1] for e in self.events})]
        out += [self._event(*e) for e in self.events]
        return out

    def abandon(self) -> None:
        """Stop recording; what rank 0 wrote as the job ran stays in the file."""
        self._stop_recording()

    def _stop_recording(self) -> None:
        global _recorder
        self.closed = True
        lifetime.unregister(self)
        if _recorder is self:
            _recorder = None
        if self._writer is not None:
            self._writer.stop()

    def close(self) -> None:
        """Gather every rank's events to rank 0 and write the trace there.

        .. warning:: Collective.
        """
        if self.closed:
            return
        self._stop_recording()
        parts = self.comm.gather((self._trace_events(), self.dropped), root=0)
        if self.comm.rank != 0:
            return
        events = [e for part, _ in parts for e in part]
        dropped = sum(d for _, d in parts)
        temporary = f"{self.path}.tmp-{os.getpid()}"
        try:
            with open(temporary, "w") as f:
                json.dump({"traceEvents": events, "displayTimeUnit": "ms",
                           "otherData": {"producer": "hpcddp", "ranks": self.comm.size,
                                         "events_dropped": dropped,
                                         "start_time_since_epoch_in_micros":
                                             self.began_unix_us}}, f)
            os.replace(temporary, self.path)
        except OSError as error:
            if os.path.exists(temporary):
                os.unlink(temporary)
            # The job's work is done; a trace that cannot be written (its folder removed,
            # the disk full) is said, not raised at the job's end.
            warnings.warn(f"hpcddp: the timeline's whole trace could not be written to "
                          f"{self.path} ({error.strerror or error}); what was written as "
                          f"the job ran stays there", RuntimeWarning, stacklevel=2)


class _Writer:
    """Rank 0's: writes the events recorded so far into the file every ``_WRITE_S``, on a
    thread of its own, so a span costs its recorder one append wherever it ends (the MPI
    thread's among them)."""

    _WRITE_S = 0.02

    def __init__(self, timeline: "Timeline"):
        self.timeline, self.written, self.lanes = timeline, 0, set()
        self.file = open(timeline.path, "w")
        self.file.write("[\n")
        self._write(timeline._process_events())
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="hpcddp-timeline", daemon=True)
        self.thread.start()

    def _write(self, events) -> None:
        self.file.write("".join(json.dumps(e) + ",\n" for e in events))
        self.file.flush()

    def _drain(self) -> None:
        timeline = self.timeline
        fresh = timeline.events[self.written:]  # a copy: other threads append meanwhile
        self.written += len(fresh)
        out = []
        for event in fresh:
            if event[1] not in self.lanes:
                self.lanes.add(event[1])
                out.append(timeline._lane_event(event[1]))
            out.append(timeline._event(*event))
        if out:
            self._write(out)

    def _run(self) -> None:
        while not self._stop.wait(self._WRITE_S):
            self._drain()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()
        self._drain()
        self.file.close()


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
