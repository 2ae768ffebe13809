"""``Transfer``: one tensor operation of a ``Transport``, from start to a usable result.

An operation is one or more ``Piece``s, each one MPI request with the bindings of the
tensors it touches. The transfer brings each piece's result back once MPI has completed
it, records the events a consumer stream waits for, and returns borrowed buffers.
"""

from typing import Callable, List, NamedTuple, Optional, Sequence, Tuple

import torch

from mpi4py import MPI

from hpcddp import timeline
from hpcddp.comm import activity, serial
from hpcddp.comm.handle import Handle
from hpcddp.transport.routes import Binding, Route

__all__ = ["Issue", "Piece", "Transfer", "Use", "reads", "updates", "writes"]

Issue = Callable[..., "MPI.Request"]


class Use(NamedTuple):
    """How one MPI operation uses a tensor: whether MPI reads it, writes it, or both."""

    tensor: torch.Tensor
    read: bool
    write: bool


def reads(tensor: torch.Tensor) -> Use:
    """MPI reads ``tensor`` (a send buffer)."""
    return Use(tensor, read=True, write=False)


def writes(tensor: torch.Tensor) -> Use:
    """MPI writes ``tensor`` (a receive buffer)."""
    return Use(tensor, read=False, write=True)


def updates(tensor: torch.Tensor) -> Use:
    """MPI reads ``tensor`` and writes the result into it (in place)."""
    return Use(tensor, read=True, write=True)


class Piece:
    """A part of an operation with one MPI request: its bindings and how to issue it.

    It names its operation rather than holding its ``Transfer``: a piece that pointed back
    at the transfer listing it would make a reference cycle, and the cycle would keep the
    bucket's gradients alive until Python's cyclic collector ran (a model's worth of memory
    per step, several steps long).
    """

    __slots__ = ("name", "lane", "bindings", "issue_fn", "request", "done", "finished",
                 "issued_at", "nbytes", "seq", "call")

    def __init__(self, name: str, lane: int, bindings: Sequence[Binding], issue_fn: Issue):
        self.name, self.lane, self.bindings, self.issue_fn = name, lane, list(bindings), issue_fn
        # Host bytes MPI works on (device buffers are not counted: on a GPU the transport
        # keeps no more in flight than before; the bound is about MPI's host scratch).
        self.nbytes = sum(getattr(b.memory, "nbytes", 0) for b in self.bindings
                          if not getattr(b.memory, "is_cuda", False))
        self.request: Optional[MPI.Request] = None
        self.done = False      # MPI has completed the request
        self.finished = False  # its result has been brought back
        self.issued_at = 0     # timeline.now() when issued
        self.seq: Optional[int] = None  # its operation's collective number (None: p2p)
        self.call: Optional[str] = None

    def completed(self, ended: Optional[int] = None) -> None:
        """MPI has completed the request (as a Test or Wait saw, now or at ``ended``,
        ``timeline.now()`` then): the timeline's reduction span runs from its issue."""
        self.done = True
        timeline.mark(self.name, self.lane, self.issued_at, ended)

    def is_ready(self) -> bool:
        return all(binding.is_ready() for binding in self.bindings)

    def wait_ready(self) -> None:
        for binding in self.bindings:
            if binding.ready is not None:
                binding.ready.synchronize()


class Transfer(Handle):
    """One tensor operation, from start to a result the consumer stream can read.

    Created by the ``Transport``; it issues the pieces, ``wait()`` completes them and
    makes the caller's current CUDA stream wait for the copies back. ``result`` is what
    ``wait()`` returns (the reduced tensor, or the operation's output tensors).

    Args:
        transport: the ``Transport`` that made it, which it asks to ``advance``, to
            ``issue_through`` a piece and to ``forget_done`` (not imported here: the
            transport imports this module).
        route: the route of its tensors.
        name: for messages.
        result: what ``wait()`` returns.
        lane: the timeline's lane for its spans.
        parts: ``(bindings, issue)`` of each piece: one MPI request each.
        collective: ``(channel, seq, call)`` where the operation is a collective (the
            watchdog's accounting, ``hpcddp.comm.activity``); None for point-to-point.
    """

    __slots__ = ("transport", "route", "pieces", "_streams", "_events", "lane")

    def __init__(self, transport, route: Route, name: str, result=None,
                 lane: int = timeline.TORCH,
                 parts: Sequence[Tuple[Sequence[Binding], Issue]] = (),
                 collective: Optional[Tuple["activity.Channel", int, str]] = None):
        super().__init__(name=name, result=result, lock=transport.lock)
        self.transport, self.route, self.lane = transport, route, lane
        if collective is not None:
            self.channel, self.seq, self.call = collective
        self.pieces: List[Piece] = [Piece(name, lane, bindings, issue)
                                    for bindings, issue in parts]
        for piece in self.pieces:  # for the watchdog, while complete_issued waits
            piece.seq, piece.call = self.seq, self.call
        self._streams = []  # streams that copies back were queued on
        self._events = []   # recorded on them once every piece has finished

    @property
    def issued(self) -> bool:
        return all(piece.request is not None for piece in self.pieces)

    @property
    def ready(self):
        """The event the first piece waits for (None when MPI may start at once)."""
        return self.pieces[0].bindings[0].ready

    @ready.setter
    def ready(self, event):
        for piece in self.pieces:
            for binding in piece.bindings:
                binding.ready = event

    def test(self) -> bool:
        """Drive the transport; once MPI has completed every piece, bring the results
        back and run the callbacks. Returns whether the transfer is done."""
        with self._lock:
            if not self._done:
                self.transport.advance()
                if all(piece.done for piece in self.pieces):
                    self._complete()
        return self._done

    def _block(self) -> None:
        """Issue and complete the pieces in order, holding the lock only to test."""
        for piece in self.pieces:
            self.transport.issue_through(piece)
            if piece.done:
                pass  # seen complete already (Transport.complete_issued)
            elif isinstance(piece.request, MPI.Request):
                serial.wait(piece.request, nudge=True)  # the MPI thread polls it
                with self._lock:
                    if not piece.done:
                        piece.completed()
            else:
                # hpcddp's own (a ring, the node-aware stages): the MPI thread runs its
                # steps, as it does at DDP's end of backward. Polled here instead, each
                # of its Isend, Irecv and Test would be a hand-over of its own, and the
                # ring would move a fraction of what the link can
                # (tests/mpi/test_ring.py checks that no call is handed over).
                serial.until(piece.request.Test, nudge=True)
                with self._lock:
                    if not piece.done:
                        piece.completed()
            # Each piece goes back as soon as it is in, while later ones are reduced.
            with self._lock:
                self._bring_back(piece)
        with self._lock:
            self._complete()

    def wait(self, timeout: Optional[float] = None):
        """Block until the result is in place as seen by the current CUDA stream.

        Raises:
            HandleTimeout: as ``Handle.wait``.

        .. warning:: Synchronization point: issues every earlier operation, waits for
           this operation's producer (or copy) events and for every rank's contribution.
        """
        super().wait(timeout)
        if self._events:
            device = self.pieces[0].bindings[0].tensor.device
            for event in self._events:
                self.transport.cuda.current_stream(device).wait_event(event)
        return self.result

    def synchronize(self) -> None:
        """Block the host until the copies back have run (for results read by any stream)."""
        for event in self._events:
            event.synchronize()

    def _bring_back(self, piece: Piece) -> None:
        if piece.finished:
            return
        piece.finished = True
        for binding in piece.bindings:
            if binding.finish is not None:
                stream = binding.finish()
                if stream is not None and stream not in self._streams:
                    self._streams.append(stream)

    def _complete(self) -> None:
        """Every piece is done: results back, consumer events recorded, buffers returned."""
        if self._done:
            return
        for piece in self.pieces:
            self._bring_back(piece)
        for stream in self._streams:
            event = self.transport.cuda.Event()
            event.record(stream)
            self._events.append(event)
        for piece in self.pieces:
            for binding in piece.bindings:
                if binding.release is not None:
                    binding.release()
        self.transport.forget_done()
        self._finish()
