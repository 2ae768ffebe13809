"""The engine behind ``hpcddp.horovod``: named operations matched across ranks.

Horovod's contract, which its programs and tests rely on: an operation is keyed by its
kind and name (as Horovod's ``allreduce.<name>``: an allgather and an allreduce of one
name are two operations), and ranks may start named operations in any order; each runs once every rank of
its process set has started it, with the same shape, dtype, device, op and root
everywhere, or fails on every rank with a message naming the tensor and the ranks.
A second operation of a name still in flight on a rank is refused at once.

How it runs, all of it on hpcddp's MPI thread (``hpcddp.comm.owner``), as Horovod's
background thread is the one that enters MPI:

1. ``submit`` (any thread) queues an ``Entry``, returns its handle at once, and has the
   MPI thread run the engine's ``_step`` (posted there until nothing is left to do).
2. Each step sends the coordinator (rank 0 of the job) a ``Request`` for each new entry
   and takes what has arrived: requests on the coordinator, responses elsewhere. It
   never blocks: the MPI thread polls it between its other work, pausing as for a
   patient wait, so the training thread keeps its core. Nothing sleeps a cycle: a name
   is decided once the last rank's request arrives, and fusion takes what is ready then
   (``HOROVOD_CYCLE_TIME`` has nothing to set). An idle coordinator looks for requests
   every ``_WAKE_S`` (for sets without rank 0, and for the stall check), and warns of
   names some ranks started and others have not after
   ``HOROVOD_STALL_CHECK_TIME_SECONDS``.
3. The coordinator keeps, per (process set, kind, name), each rank's request
   (``coordinator.Table``). Once every rank of the set has one, it checks they agree and
   appends a response: a fused allreduce of consecutive ready allreduces that agree in
   dtype, device, op and scaling, up to ``HOROVOD_FUSION_THRESHOLD`` bytes (a group,
   ``grouped_*``, is released whole), any other operation alone, or an error. Responses
   go to the set's ranks in one order.
4. Every rank starts the responses for its sets in that order (``execute.py``), on a
   communicator per set, so MPI sees the same collectives in the same order everywhere;
   later steps test them and complete each handle as its operation ends. A handle
   completes while the caller computes; ``poll`` asks, ``wait`` blocks.
"""

import itertools
import logging
from collections import deque
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

from mpi4py import MPI

from hpcddp import timeline
from hpcddp.comm import activity, serial
from hpcddp.horovod import lanes
from hpcddp.horovod.lanes import TensorLanes
from hpcddp.horovod.coordinator import Table, take_messages
from hpcddp.horovod.requests import Entry, Request, zeros_entry
from hpcddp.horovod.set_registry import SetRegistry
from hpcddp.horovod.settings import number

__all__ = ["Engine"]

log = logging.getLogger("hpcddp.horovod")

_REQUEST_TAG, _RESPONSE_TAG = 1, 2
_WAKE_S = 0.05  # how often an idle coordinator looks for requests


class Engine:
    """Negotiates and runs named operations over hpcddp's ``world`` (``basics.init``)."""

    def __init__(self, world):
        from hpcddp.horovod.execute import Executor

        self.world = world
        self.rank, self.size = world.rank, world.size
        self.fusion_bytes = int(number("HOROVOD_FUSION_THRESHOLD", 128 * 1024 * 1024))
        self._negotiation = world.comm.Dup()   # requests and responses only, never data
        self.sets = SetRegistry(world, Executor)  # process sets, by id
        self._sets = self.sets.infos
        self._handles = itertools.count(1)
        self._unnamed: Dict[Tuple[int, str], int] = {}
        self._cond = threading.Condition()
        self._queued: List[Entry] = []          # submitted, not yet sent
        self._inflight: Dict[Tuple[int, str], Entry] = {}
        self._entries: Dict[int, Entry] = {}    # by handle, until the handle is released
        # Names taken until their handle is released: an operation that completed before
        # its caller waited still holds its name, so a duplicate is refused however fast
        # the other ranks were (Horovod's cycle made that likely, not certain).
        self._taken: Dict[Tuple[int, str], Entry] = {}
        self._sends: List[MPI.Request] = []
        self._todo: deque = deque()             # responses not yet started, in order
        self._running: list = []                # (response, entries, Running, began)
        self._table = Table(self._sets, self.fusion_bytes)  # used on the coordinator
        self._lanes = TensorLanes()
        self._closing = False
        self._posted = False    # _step is posted on the MPI thread
        self._stopped = False   # closed or failed: _step does nothing more
        self._failure: Optional[BaseException] = None
        self.sets.add(list(range(self.size)))   # the global set, id 0
        self._ticker: Optional[threading.Thread] = None
        self._tick_stop = threading.Event()
        if self.rank == 0:
            self._ticker = threading.Thread(target=self._tick, name="hpcddp-horovod",
                                            daemon=True)
            self._ticker.start()

    # -- the caller's side ---------------------------------------------------------------

    def submit(self, request: Request, tensor=None, output=None,
               finish: Optional[Callable] = None) -> int:
        """Start an operation; its handle. ``ValueError`` at once for a name already in
        flight here, or a process set this rank is not in."""
        info = self.sets.get(request.set_id)
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
        key = request.key()
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
            posted, self._posted = self._posted, True
        if posted:
            serial.wake()  # the MPI thread sends it now, not after its pause
        else:
            serial.post(self._step, patient=True)
        return handle

    def poll(self, handle: int) -> bool:
        """Whether the operation of ``handle`` has completed (or failed)."""
        return self._entry(handle).done.is_set()

    def wait(self, handle: int) -> Entry:
        """Block until ``handle``'s operation completes; release the handle. Raises the
        operation's error, on every rank it failed on."""
        entry = self._entry(handle)
        if not entry.done.is_set():
            # Handed to the MPI thread as a wait of its own: while a thread waits there
            # not patiently, it polls the engine's step back to back (the caller has
            # nothing to compute), and it wakes the caller the moment the step is done.
            with activity.waiting(f"hvd: {entry.request.kind} {entry.request.name!r}"):
                serial.until(lambda: entry.done.is_set() or self._failure is not None)
        with self._cond:
            self._entries.pop(handle, None)
            self._taken.pop(entry.request.key(), None)
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

    # -- the engine's step, on the MPI thread ----------------------------------------

    def _tick(self) -> None:
        """The coordinator's: while idle, have a step look for requests every _WAKE_S."""
        while not self._tick_stop.wait(_WAKE_S):
            with self._cond:
                if self._posted or self._stopped:
                    continue
                self._posted = True
            serial.post(self._step, patient=True)

    def _step(self) -> bool:
        """One look round: send, take, decide, start, complete. True: nothing is left
        to do (the step is no longer posted)."""
        if self._stopped:
            return True
        try:
            return self._look_round()
        except BaseException as error:  # noqa: BLE001 - every handle must learn of it
            self._fail(error)
            _end_job(error)
            return True

    def _look_round(self) -> bool:
        coordinator = self.rank == 0
        comm = self._negotiation
        with self._cond:
            fresh, self._queued = self._queued, []
        moved = bool(fresh)
        if self._sends:
            self._sends = [r for r in self._sends if not MPI.Request.Test(r)]
        requests = [e.request for e in fresh]
        if coordinator:
            arrived = requests + take_messages(comm, _REQUEST_TAG)
            if arrived:
                lanes.cycle()
            if arrived or self._table.stall_check_due():
                self._todo.extend(self._coordinate(arrived))
                moved = True
        else:
            if requests:
                self._sends.append(MPI.Comm.isend(comm, requests, dest=0, tag=_REQUEST_TAG))
            responses = take_messages(comm, _RESPONSE_TAG)
            if responses:
                self._todo.extend(responses)
                moved = True
        while self._todo:
            self._start(self._todo.popleft())
            moved = True
        if self._running:
            still = []
            for running in self._running:
                if running[2].test():
                    self._finish(*running)
                    moved = True
                else:
                    still.append(running)
            self._running = still
        if moved:
            serial.moved()
        with self._cond:
            if self._queued:
                return False
            busy = self._inflight or self._running or (coordinator and self._table)
            if busy and not (self._closing and not self._inflight):
                return False
            self._posted = False
            return True

    # -- the coordinator -----------------------------------------------------------------

    def _coordinate(self, requests: List[Request]) -> list:
        responses = self._table.take(requests)
        # Who takes each response is read before any is sent: once a set without rank 0
        # has its last response, its ranks may finish and remove it (SetRegistry.remove).
        per_rank: Dict[int, list] = {}
        own = []
        for response in responses:
            for rank in self._sets[response.set_id].ranks:
                if rank == 0:
                    own.append(response)
                else:
                    per_rank.setdefault(rank, []).append(response)
        for rank, sent in per_rank.items():
            self._sends.append(MPI.Comm.isend(self._negotiation, sent, dest=rank,
                                              tag=_RESPONSE_TAG))
        return own

    # -- running a response --------------------------------------------------------

    def _start(self, response) -> None:
        info = self._sets[response.set_id]
        with self._cond:
            entries = [self._inflight.get((response.set_id, response.kind, name))
                       for name in response.names]
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
        if response.error is not None:
            for entry in entries:
                entry.error = RuntimeError(response.error)
            self._complete(response, entries)
            return
        began = timeline.now()
        try:
            running = info.executor.start(response, entries)
        except Exception as error:  # noqa: BLE001 - raised at each handle's wait
            for entry in entries:
                entry.error = error
            self._complete(response, entries)
            return
        self._running.append((response, entries, running, began))

    def _finish(self, response, entries, running, began) -> None:
        try:
            running.finish()
        except Exception as error:  # noqa: BLE001 - raised at each handle's wait
            for entry in entries:
                entry.error = error
        self._lanes.record(response, entries, began)
        self._complete(response, entries)

    def _complete(self, response, entries) -> None:
        with self._cond:
            for name, entry in zip(response.names, entries):
                if not entry.zeros:
                    del self._inflight[(response.set_id, response.kind, name)]
                    entry.done.set()

    def _fail(self, error: BaseException) -> None:
        from hpcddp.horovod.common import HorovodInternalError

        failure = error if isinstance(error, HorovodInternalError) else \
            HorovodInternalError(f"hvd: the engine on rank {self.rank} stopped: {error!r}")
        if failure is not error:
            failure.__cause__ = error  # what it was: a process failure, under ULFM
        with self._cond:
            self._failure = failure
            self._stopped = True
            entries = list(self._inflight.values()) + self._queued
            self._inflight.clear()
            self._queued = []
        for entry in entries:
            entry.error = failure
            entry.done.set()

    def close(self) -> None:
        """Wait for the operations in flight, stop the engine, free the communicators."""
        with self._cond:
            self._closing = True
            posted, self._posted = self._posted, True
        if posted:
            serial.wake()
        else:
            serial.post(self._step, patient=True)
        self._tick_stop.set()
        if self._ticker is not None:
            self._ticker.join(timeout=5.0)
        if self.rank == 0:
            deadline = time.monotonic() + 5.0
            while self._inflight and time.monotonic() < deadline:
                time.sleep(0.01)
            with self._cond:
                self._inflight.clear()
        deadline = time.monotonic() + 10.0
        while self._posted and time.monotonic() < deadline:
            time.sleep(0.01)
        self._stopped = True
        if self._inflight:
            self._fail(ValueError("Horovod is shutting down."))
        self.sets.close()
        serial.call(lambda: [MPI.Request.Wait(r) for r in self._sends])
        self._negotiation.Free()


    def abandon(self) -> None:
        """Stop without a collective or a wait (a recovery: the ranks it waits for are
        dead, its communicators revoked): every operation in flight fails, the
        coordinator's ticker stops, nothing is freed."""
        self._fail(ValueError("Horovod was reset after a process failure."))
        self._tick_stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join(timeout=1.0)


def _end_job(error: BaseException) -> None:
    """The engine failed on the MPI thread: end the job as an uncaught exception in a
    thread of hpcddp's ends it (the abort hook names this rank). The other ranks wait
    for this engine (rank 0 coordinates), and this rank's main thread may be in a
    collective no handle is part of. Raised on a thread of its own, since the MPI thread
    must go on to make the abort's calls."""
    def fail():
        raise error

    threading.Thread(target=fail, name="hpcddp-horovod", daemon=True).start()
