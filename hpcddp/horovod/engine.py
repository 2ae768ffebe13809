"""The engine behind ``hpcddp.horovod``: named operations matched across ranks.

Horovod's contract, which its programs and tests rely on: an operation is keyed by its
name, and ranks may start named operations in any order; each runs once every rank of
its process set has started it, with the same shape, dtype, device, op and root
everywhere, or fails on every rank with a message naming the tensor and the ranks.
A second operation of a name still in flight on a rank is refused at once.

How it runs:

1. ``submit`` (any thread) queues an ``Entry`` and returns its handle at once.
2. The engine's thread sends the coordinator (rank 0 of the job) a ``Request`` for each
   new entry, then waits, polled by hpcddp's MPI thread, for what comes first: a
   response, a new entry, or ``_WAKE_S``. The coordinator waits the same way for
   requests. Nothing sleeps a cycle: a name is decided once the last rank's request
   arrives, and fusion takes what is ready then (``HOROVOD_CYCLE_TIME`` has nothing to
   set). The coordinator warns of names some ranks started and others have not after
   ``HOROVOD_STALL_CHECK_TIME_SECONDS``.
3. The coordinator keeps, per (process set, name), each rank's request. Once every rank
   of the set has one, it checks they agree and appends a response: a fused allreduce of
   consecutive ready allreduces that agree in dtype, device, op and scaling, up to
   ``HOROVOD_FUSION_THRESHOLD`` bytes (a group, ``grouped_*``, is released whole), any
   other operation alone, or an error. Responses go to the set's ranks in one order.
4. Every rank runs the responses for its sets in that order (``execute.py``), on a
   communicator per set, so MPI sees the same collectives in the same order everywhere,
   then completes the handles. A handle completes while the caller computes; ``poll``
   asks, ``wait`` blocks.
"""

import itertools
import logging
import os
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from mpi4py import MPI

from hpcddp import timeline
from hpcddp.comm import activity, serial
from hpcddp.comm.backoff import waiting_patiently
from hpcddp.horovod.lanes import TensorLanes
from hpcddp.horovod.requests import Entry, Pending, ProcessSetInfo, Request, zeros_entry
from hpcddp.horovod.settings import number

__all__ = ["Engine"]

log = logging.getLogger("hpcddp.horovod")

_REQUEST_TAG, _RESPONSE_TAG = 1, 2
_WAKE_S = 0.05  # the longest the engine's thread waits before looking round again


class Engine:
    """Negotiates and runs named operations over hpcddp's ``world`` (``basics.init``)."""

    def __init__(self, world):
        from hpcddp.horovod.execute import Executor

        self.world = world
        self.rank, self.size = world.rank, world.size
        self.fusion_bytes = int(number("HOROVOD_FUSION_THRESHOLD", 128 * 1024 * 1024))
        self.stall_s = 0.0 if os.environ.get("HOROVOD_STALL_CHECK_DISABLE", "0") not in (
            "", "0") else number("HOROVOD_STALL_CHECK_TIME_SECONDS", 60.0)
        self.stall_shutdown_s = number("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", 0.0)
        self._negotiation = world.comm.Dup()   # requests and responses only, never data
        self._sets: Dict[int, ProcessSetInfo] = {}
        self._next_set = 0
        self._handles = itertools.count(1)
        self._unnamed: Dict[Tuple[int, str], int] = {}
        self._make_executor = Executor
        self._cond = threading.Condition()
        self._queued: List[Entry] = []          # submitted, not yet sent
        self._inflight: Dict[Tuple[int, str], Entry] = {}
        self._entries: Dict[int, Entry] = {}    # by handle, until the handle is released
        # Names taken until their handle is released: an operation that completed before
        # its caller waited still holds its name, so a duplicate is refused however fast
        # the other ranks were (Horovod's cycle made that likely, not certain).
        self._taken: Dict[Tuple[int, str], Entry] = {}
        self._sends: List[MPI.Request] = []
        self._table: Dict[Tuple[int, str], Pending] = {}
        self._joined: Dict[int, List[int]] = {}  # the coordinator's: per set, in join order
        self._arrivals = itertools.count()
        self._lanes = TensorLanes()
        self._closing = False
        self._waiting = False  # the engine's thread waits in serial.until
        self._failure: Optional[BaseException] = None
        self.add_set(list(range(self.size)))    # the global set, id 0
        self._thread = threading.Thread(target=self._run, name="hpcddp-horovod", daemon=True)
        self._thread.start()

    # -- process sets (collective over the job) ------------------------------------------

    def add_set(self, ranks: Sequence[int]) -> int:
        """Set up a process set of Horovod ``ranks`` and return its id. Collective."""
        ranks = sorted(ranks)
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or len(set(ranks)) != len(ranks):
            raise ValueError(f"process set {ranks}: ranks must be distinct Horovod ranks "
                             f"0..{self.size - 1}")
        member = self.rank in ranks
        with activity.named(f"hvd: setting up process set {ranks}"):
            comm = self.world.comm.Split(0 if member else MPI.UNDEFINED, self.rank)
        set_id = self._next_set
        self._next_set += 1
        executor = self._make_executor(comm, self.world, ranks) if member else None
        self._sets[set_id] = ProcessSetInfo(set_id, ranks, ranks.index(self.rank)
                                            if member else None, executor)
        return set_id

    def remove_set(self, set_id: int) -> bool:
        """Remove a process set; False where there is none of that id. Collective."""
        # Every rank first: the coordinator must keep the set until no rank has an
        # operation of it left (a member may still be in one as another rank gets here).
        with activity.named("hvd: removing a process set"):
            self.world.comm.Barrier()
        info = self._sets.pop(set_id, None)
        if info is None:
            return False
        if info.executor is not None:
            info.executor.close()
        return True

    def find_set(self, ranks: Sequence[int]) -> Optional[int]:
        ranks = sorted(ranks)
        return next((i for i, s in self._sets.items() if s.ranks == ranks), None)

    def process_set(self, set_id: int) -> ProcessSetInfo:
        info = self._sets.get(set_id)
        if info is None:
            raise ValueError("Process set does not exist or has not been registered.")
        return info

    # -- the caller's side ---------------------------------------------------------------

    def submit(self, request: Request, tensor=None, output=None,
               finish: Optional[Callable] = None) -> int:
        """Start an operation; its handle. ``ValueError`` at once for a name already in
        flight here, or a process set this rank is not in."""
        info = self.process_set(request.set_id)
        if info.rank is None:
            raise ValueError(f"hvd: {request.kind} {request.name!r} on process set "
                             f"{info.ranks}, which does not include this process "
                             f"(rank {self.rank}); call it on the set's ranks only")
        handle = next(self._handles)
        if request.name is None:
            # Numbered per process set and kind: ranks that start the same unnamed
            # operations in the same order name them alike, whatever else they start.
            key = (request.set_id, request.kind)
            count = self._unnamed[key] = self._unnamed.get(key, 0) + 1
            request.name = f"{request.kind}.noname.{count}"
        request.rank = self.rank
        entry = Entry(request, tensor, output, finish)
        key = (request.set_id, request.name)
        with self._cond:
            if self._failure is not None:
                raise self._failure
            if self._closing:
                raise ValueError("Horovod is shutting down.")
            if key in self._taken:
                raise ValueError(f"hvd: another {self._taken[key].request.kind} named "
                                 f"{request.name!r} is still in flight on this rank; give "
                                 f"each concurrent operation a different name")
            self._inflight[key] = entry
            self._taken[key] = entry
            self._entries[handle] = entry
            self._queued.append(entry)
            self._cond.notify()
        if self._waiting:
            serial.wake()
        return handle

    def poll(self, handle: int) -> bool:
        """Whether the operation of ``handle`` has completed (or failed)."""
        return self._entry(handle).done.is_set()

    def wait(self, handle: int) -> Entry:
        """Block until ``handle``'s operation completes; release the handle. Raises the
        operation's error, on every rank it failed on."""
        entry = self._entry(handle)
        if not entry.done.is_set():
            with activity.waiting(f"hvd: {entry.request.kind} {entry.request.name!r}"):
                while not entry.done.wait(0.1):
                    if self._failure is not None and not entry.done.is_set():
                        break
        with self._cond:
            self._entries.pop(handle, None)
            self._taken.pop((entry.request.set_id, entry.request.name), None)
        if entry.error is not None:
            raise entry.error
        if not entry.done.is_set():
            raise self._failure
        return entry

    def _entry(self, handle: int) -> Entry:
        entry = self._entries.get(handle)
        if entry is None:
            raise ValueError(f"hvd: handle {handle!r} is not an operation in flight "
                             f"(already synchronized, or never started)")
        return entry

    # -- the engine's thread -------------------------------------------------------------

    def _run(self) -> None:
        with waiting_patiently():  # its waits overlap the backward on the training thread
            self._serve()

    def _serve(self) -> None:
        coordinator = self.rank == 0
        arrived: list = []  # the requests the coordinator's wait took
        try:
            while True:
                with self._cond:
                    while not (self._queued or self._inflight or self._closing
                               or coordinator):
                        self._cond.wait()
                    if self._closing and not self._inflight:
                        return
                    fresh, self._queued = self._queued, []
                    busy = bool(self._inflight)
                requests = [e.request for e in fresh]
                if coordinator:
                    responses = self._coordinate(requests + arrived + self._exchange([]))
                else:
                    responses = self._exchange(requests, wait=busy)
                for response in responses:
                    self._execute(response)
                if coordinator:
                    arrived = self._coordinator_wait()
        except BaseException as error:  # noqa: BLE001 - every handle must learn of it
            self._fail(error)
            # And the job: the other ranks wait for this engine (rank 0 coordinates), and
            # this rank's main thread may be in a collective no handle is part of. The
            # thread's exception ends the job through hpcddp's abort, naming this rank.
            raise

    def _exchange(self, requests: List[Request], wait: bool = False) -> list:
        """Send ``requests`` to the coordinator; take what arrived (requests on the
        coordinator, responses elsewhere). With ``wait``, until a response arrives, this
        rank submits more, or ``_WAKE_S`` passes: the MPI thread polls for it, so what
        arrives is acted on at once."""
        comm = self._negotiation
        tag = _REQUEST_TAG if self.rank == 0 else _RESPONSE_TAG

        def take():
            self._sends = [r for r in self._sends if not MPI.Request.Test(r)]
            got = []
            while True:
                message = MPI.Comm.improbe(comm, MPI.ANY_SOURCE, tag)
                if message is None:
                    return got
                got.extend(message.recv())

        def step():
            if requests:
                self._sends.append(MPI.Comm.isend(comm, requests, dest=0, tag=_REQUEST_TAG))
            return take()

        got = serial.call(step)
        if got or not wait:
            return got
        deadline = time.monotonic() + _WAKE_S

        def arrived():  # on the MPI thread, which pauses between its polls (patient)
            return take() or bool(self._queued or self._closing
                                  or time.monotonic() > deadline)

        self._waiting = True  # a submit wakes the MPI thread to look
        try:
            got = serial.until(arrived)
        finally:
            self._waiting = False
        return got if isinstance(got, list) else []

    def _coordinator_wait(self) -> list:
        """While anything is pending, wait as the others do (for a request or an entry of
        its own); idle, sleep until an entry of its own or ``_WAKE_S`` (polling MPI then
        would keep the MPI thread at 80 % of a core): the others' requests for names it
        has not started cannot be answered before it starts them, except in sets without
        rank 0, which wait up to ``_WAKE_S`` for their first request to be seen."""
        with self._cond:
            pending = bool(self._inflight or self._table)
            if not pending and not self._queued:
                self._cond.wait(_WAKE_S)
        return self._exchange([], wait=pending)

    def _send_responses(self, per_rank: Dict[int, list]) -> None:
        comm = self._negotiation

        def step():
            for rank, responses in per_rank.items():
                self._sends.append(MPI.Comm.isend(comm, responses, dest=rank,
                                                  tag=_RESPONSE_TAG))
        serial.call(step)

    # -- the coordinator -----------------------------------------------------------------

    def _coordinate(self, requests: List[Request]) -> list:
        from hpcddp.horovod.negotiate import ready_responses, stalled

        for request in requests:
            key = (request.set_id, request.name)
            pending = self._table.get(key)
            if pending is None:
                pending = self._table[key] = Pending(next(self._arrivals))
            pending.requests[request.rank] = request
            if request.kind == "join":
                self._joined.setdefault(request.set_id, []).append(request.rank)
        responses = ready_responses(self._table, self._sets, self.fusion_bytes,
                                    self._joined)
        stalled(self._table, self._sets, self.stall_s, self.stall_shutdown_s, log)
        # Who takes each response is read before any is sent: once a set without rank 0
        # has its last response, its ranks may finish and remove it (remove_set).
        per_rank: Dict[int, list] = {}
        own = []
        for response in responses:
            for rank in self._sets[response.set_id].ranks:
                if rank == 0:
                    own.append(response)
                else:
                    per_rank.setdefault(rank, []).append(response)
        if per_rank:
            self._send_responses(per_rank)
        return own

    # -- running a response --------------------------------------------------------------

    def _execute(self, response) -> None:
        info = self._sets[response.set_id]
        with self._cond:
            entries = [self._inflight.get((response.set_id, name)) for name in response.names]
            joined = None not in entries or any(
                e.request.kind == "join" and e.request.set_id == response.set_id
                for e in self._inflight.values())  # looked for only where one is missing
        if None in entries:
            if not joined:
                raise RuntimeError(f"hvd: a response for {response.names} reached rank "
                                   f"{self.rank}, which has not started all of them")
            if response.error is not None:
                return  # failed on the ranks that started it; this rank had joined
            entries = [e if e is not None else zeros_entry(response, k)
                       for k, e in enumerate(entries)]
        if response.error is None:
            began = timeline.now()
            try:
                info.executor.run(response, entries)
            except Exception as error:  # noqa: BLE001 - raised at each handle's wait
                for entry in entries:
                    entry.error = error
            self._lanes.record(response, entries, began)
        else:
            for entry in entries:
                entry.error = RuntimeError(response.error)
        with self._cond:
            for name, entry in zip(response.names, entries):
                if not entry.zeros:
                    del self._inflight[(response.set_id, name)]
                    entry.done.set()

    def _fail(self, error: BaseException) -> None:
        from hpcddp.horovod.common import HorovodInternalError

        failure = error if isinstance(error, HorovodInternalError) else \
            HorovodInternalError(f"hvd: the engine on rank {self.rank} stopped: {error!r}")
        with self._cond:
            self._failure = failure
            entries = list(self._inflight.values()) + self._queued
            self._inflight.clear()
            self._queued = []
        for entry in entries:
            entry.error = failure
            entry.done.set()

    def close(self) -> None:
        """Wait for the operations in flight, stop the thread, free the communicators."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        serial.wake()
        if self.rank == 0:
            deadline = time.monotonic() + 5.0
            while self._inflight and time.monotonic() < deadline:
                time.sleep(0.01)
            with self._cond:
                self._inflight.clear()
                self._cond.notify()
        self._thread.join(timeout=10.0)
        for entry in list(self._inflight.values()):
            self._fail(ValueError("Horovod is shutting down."))
            break
        for info in self._sets.values():
            if info.executor is not None:
                info.executor.close()
        self._sets.clear()
        serial.call(lambda: [MPI.Request.Wait(r) for r in self._sends])
        self._negotiation.Free()
