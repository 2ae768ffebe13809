"""``Transport``: tensor operations on one communicator, issued in the order started.

MPI requires every rank to issue collectives on a communicator in the same order. On a
GPU a tensor may be started before its data is ready (a gradient hook runs ahead of the
kernels it queued), so operations wait in a queue and are issued strictly in start
order, each once its data is ready, however their events complete. ``advance()`` issues
what it can and ``Test``s what is in flight (MPI makes no progress while Python
computes); it never blocks. A ``Transfer`` is the ``Handle`` of one operation.

Its MPI calls are made by hpcddp's MPI thread (``hpcddp.comm.serial``) and its queues are
guarded by ``hpcddp.comm.serial.LOCK``, so the futures' thread (``hpcddp.comm.progress_thread``)
may complete transfers while the caller starts new ones, and the MPI thread's nudges
(``serial.keep_moving``) move them while the caller waits elsewhere.
"""

from collections import deque
from typing import Any, Callable, Deque, List, Optional, Sequence

import torch
from mpi4py import MPI

from hpcddp import timeline
from hpcddp.comm import activity, serial
from hpcddp.comm.backoff import Backoff
from hpcddp.env import get_setting
from hpcddp.faults.fingerprint import CollectiveCheck
from hpcddp.transport.allreduce.mpi import Reduction
from hpcddp.transport.allreduce.policy import Reductions
from hpcddp.transport.routes import DeviceRoute, HostRoute, Route
from hpcddp.transport.staging import StagedRoute
from hpcddp.transport.transfer import Issue, Piece, Transfer, Use

__all__ = ["Transfer", "Transport"]


class Transport:
    """Starts tensor operations on ``comm`` and issues them in start order.

    Args:
        comm: the communicator; nothing else may issue collectives on it.
        cuda_aware: MPI accepts CUDA device buffers.
        cuda: the CUDA API (``torch.cuda``); unit tests of the ordering pass a stand-in.
        pinned: page-lock the staging buffers (off only where there is no CUDA).
        chunk_bytes: staged allreduces travel in pieces of about this size (0: whole).
        reduction: how an allreduce is carried out at first: ``"mpi"`` (MPI's
            ``Iallreduce``), ``"ring"`` (hpcddp's ring of point-to-point) or ``"node"``
            (node-aware), all in ``allreduce/``; ``allreduce.policy.Reductions`` picks
            per buffer.
        device_reductions: MPI's own reductions other than allreduce (``Ireduce``,
            ``Ireduce_scatter``, through ``submit(..., reduces=True)``) may be given
            device buffers; False stages them (Open MPI's libnbc reduces on the host).
        inflight_bytes: the most bytes of host memory in issued, uncompleted operations
            (device buffers are not counted); a piece that would pass it waits its turn
            until earlier ones complete (one may always be in flight). None:
            ``HPCDDP_INFLIGHT_MB``; 0: no bound.

    Example::

        transport = Transport(comm, cuda_aware=world.cuda_aware)
        transfer = transport.allreduce(bucket, slot=0)   # issued when its data is ready
        ...                                              # transport.advance() meanwhile
        transfer.wait()                                  # bucket holds the sum
    """

    def __init__(self, comm, cuda_aware: bool = False, cuda=torch.cuda, pinned: bool = True,
                 chunk_bytes: int = 4 << 20, reduction: str = "mpi",
                 device_reductions: bool = True, inflight_bytes: Optional[int] = None):
        self.comm, self.cuda_aware, self.cuda = comm, cuda_aware, cuda
        self.device_reductions = device_reductions
        self.inflight_bytes = get_setting("INFLIGHT_MB") << 20 if inflight_bytes is None \
            else inflight_bytes
        self.channel = activity.channel_for(comm)
        # HPCDDP_DEBUG=detail: every collective is compared across ranks before it is issued.
        self.check = CollectiveCheck(comm) if get_setting("DEBUG") == "detail" else None
        self.chunk_bytes = chunk_bytes
        self.reductions = Reductions(comm, cuda, reduction)
        self.host = HostRoute(cuda)
        self.device = DeviceRoute(cuda)
        self.staged = StagedRoute(cuda, pinned=pinned)
        self.lock = serial.LOCK  # the queues, shared with the futures' thread and nudges
        self._unissued: Deque[Piece] = deque()
        self._issued: List[Piece] = []  # issued, not yet seen complete
        self.collectives = 0  # MPI operations issued, for inspection
        # While True (DDP's backward), ``advance`` on the training thread hands its work
        # to the MPI thread without waiting for it (``_posted``): a gradient hook goes on
        # computing while the bucket it launched is issued and moved.
        self._deferred = False
        self._posted = False  # an advance is posted and not yet made
        self._failure: Optional[BaseException] = None  # raised by a posted advance
        serial.keep_moving(self)  # a ring in flight moves while its rank waits elsewhere

    # -- routes --------------------------------------------------------------------------

    def route_for(self, tensor: torch.Tensor, reduces: bool = False) -> Route:
        """The route for ``tensor``: host memory, device memory, or staged. ``reduces``:
        MPI's own reduction other than allreduce will combine it."""
        if not tensor.is_cuda:
            return self.host
        if reduces and not self.device_reductions:
            return self.staged
        # MPI's bf16 sum is a user-defined operation that runs on the host; the ring sums
        # bf16 with torch kernels where the data is.
        if self.cuda_aware and (tensor.dtype != torch.bfloat16 or self.reduction.name == "ring"):
            return self.device
        return self.staged

    @property
    def reduction(self) -> Reduction:
        """The reduction in use (``use_reduction`` switches it)."""
        return self.reductions.current

    def use_reduction(self, name: str) -> None:
        """Carry out allreduces started from now on by ``name`` (``"mpi"``, ``"ring"``,
        ``"node"``); those already started finish as they were issued.

        .. warning:: Collective, at the same point on every rank.
        """
        self.reductions.use(name)

    # -- DDP's backward ------------------------------------------------------------------

    def begin_backward(self) -> None:
        """From now until ``end_backward``, an ``advance`` on the training thread hands
        its work to the MPI thread and returns at once: a gradient hook goes on computing
        while the bucket it launched is issued and moved."""
        self._deferred = True

    def end_backward(self) -> None:
        """Every ``advance`` is made on the caller's behalf again, before it returns (also
        after a backward that raised)."""
        self._deferred = False

    # -- operations ----------------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, op: str = "sum", slot: Optional[int] = None,
                  route: Optional[Route] = None, name: Optional[str] = None) -> Transfer:
        """Start reducing ``tensor`` in place across the ranks; elementwise, so a staged
        tensor travels in pieces.

        Called on the stream that produced the data (autograd's current stream in a
        gradient hook).

        Args:
            tensor: any tensor; the result lands in it.
            op: sum, product, min, max, band, bor or bxor.
            slot: keeps the staging buffer across calls (a DDP bucket's index).
            route: the route, when the caller chose it once for its buffer.
            name: for messages; "allreduce of N <dtype>" by default.
        """
        route = route or self.route_for(tensor)
        bindings = route.bind(tensor, read=True, write=True, slot=slot,
                              chunk_bytes=self.chunk_bytes)
        name = name or f"allreduce ({op}) of {tensor.numel()} {_dtype(tensor)}"
        reduction = self.reductions.for_tensor(tensor, on_device=route is self.device)

        def issuer(piece):
            # Pieces of one slot are in flight together: each keeps scratch of its own.
            key = None if slot is None else (slot, piece)
            return lambda binding: reduction.start(binding, op, key)
        return self._start(route, name, [([b], issuer(k)) for k, b in enumerate(bindings)],
                           tensor, f"allreduce ({op}) of {_shape(tensor)}",
                           timeline.TORCH if slot is None else timeline.BUCKET_LANE + slot)

    def broadcast(self, tensor: torch.Tensor, root: int = 0,
                  name: Optional[str] = None) -> Transfer:
        """Start overwriting ``tensor`` with rank ``root``'s on every rank."""
        is_root = self.comm.rank == root
        name = name or f"broadcast of {tensor.numel()} {_dtype(tensor)} from rank {root}"
        return self.submit(name, [Use(tensor, read=is_root, write=not is_root)],
                           lambda b: self.comm.Ibcast(b.buf, root=root), result=tensor,
                           call=f"broadcast from rank {root} of {_shape(tensor)}")

    def submit(self, name: str, tensors: Sequence[Use], issue: Issue, result=None,
               call: Optional[str] = "", reduces: bool = False) -> Transfer:
        """Start one MPI operation on ``tensors``.

        Args:
            name: what it is, for messages.
            tensors: a ``Use`` (``reads``, ``writes``, ``updates``) of each tensor MPI
                touches.
            issue: called with one ``Binding`` per tensor once all are ready; returns
                the MPI request.
            result: what the transfer's ``wait()`` returns.
            call: what every rank must agree on for a collective (kind, shape, dtype,
                root), ``name`` when empty; None for point-to-point, which is neither
                counted nor compared.
            reduces: MPI reduces the data (``Ireduce``, ``Ireduce_scatter``): device
                tensors are staged where ``device_reductions`` is off.
        """
        bindings, route = [], self.host
        for tensor, read, write in tensors:
            route = self.route_for(tensor, reduces)
            bindings.extend(route.bind(tensor, read=read, write=write))
        return self._start(route, name, [(bindings, issue)], result,
                           name if call == "" else call)

    def _start(self, route, name, parts, result, call: Optional[str],
               lane: int = timeline.TORCH) -> Transfer:
        seq = None
        if call is not None:
            seq = self.channel.issue(name, call)
            if self.check is not None:
                self.check.verify(self.channel, seq, call)
        with self.lock:
            transfer = Transfer(self, route, name, result, lane, parts,
                                None if call is None else (self.channel, seq, call))
            self._unissued.extend(transfer.pieces)
            self.advance()
            return transfer

    # -- progress ------------------------------------------------------------------------

    def _issue(self, piece: Piece) -> None:
        piece.issued_at = timeline.now()
        piece.request = piece.issue_fn(*piece.bindings)
        self.collectives += 1
        self._issued.append(piece)

    def advance(self) -> None:
        """``Test`` the issued pieces so MPI makes progress, and issue, in order, the
        pieces whose data is ready while the bytes in flight allow; never blocks.

        One call handed to the MPI thread does it all, on this thread's behalf: it holds
        the lock meanwhile."""
        with self.lock:
            self._raise_failure()
            if not (self._issued or self._unissued):
                return
            if self._deferred:
                if self._posted or serial.post(self._posted_advance):
                    self._posted = True
                    return
            serial.call(self._advance)

    def _posted_advance(self) -> bool:
        """A posted ``advance``, on the MPI thread: made once the lock is free (its
        holder may be waiting for this thread); an error waits for the next caller."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            self._posted = False
            if self._failure is None:
                try:
                    self._advance()
                except BaseException as error:  # noqa: BLE001 - raised by the next advance
                    self._failure = error
        finally:
            self.lock.release()
        return True

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, self._failure = self._failure, None
            raise failure

    def _advance(self) -> None:
        """``advance``'s work, on the MPI thread while the caller holds the lock (taking
        it here would wait for ever on that caller)."""
        self._test_issued()
        issued = False
        while (self._unissued and self._unissued[0].is_ready()
               and self._has_room_for(self._unissued[0])):
            self._issue(self._unissued.popleft())
            issued = True
        if issued:
            self._test_issued()

    def _test_issued(self) -> None:
        pending = []
        for piece in self._issued:
            if piece.done:
                continue
            if piece.request.Test():
                piece.completed()  # its transfer brings the result back when asked
            else:
                pending.append(piece)
        self._issued = pending

    def _has_room_for(self, piece: Piece) -> bool:
        """Whether ``piece`` fits beside what is in flight (``inflight_bytes``): MPI's
        non-blocking reductions keep scratch the size of their message, so the bytes in
        flight are memory beside the tensors. The first piece always fits."""
        if not self.inflight_bytes:
            return True
        flying = sum(p.nbytes for p in self._issued if not p.done)
        return flying == 0 or flying + piece.nbytes <= self.inflight_bytes

    def nudge(self) -> None:
        """``advance`` if anything is in flight and no other thread is inside MPI; for
        the waits of ``serial`` (``serial.keep_moving``). Never blocks."""
        if not (self._issued or self._unissued) or not self.lock.acquire(blocking=False):
            return
        try:
            if self._failure is None:
                self.advance()
        except BaseException as error:  # noqa: BLE001 - on the MPI thread: the next caller's
            self._failure = error
        finally:
            self.lock.release()

    def forget_done(self) -> None:
        """Drop completed pieces from the in-flight list: a piece a blocking wait saw
        complete would otherwise stay there, holding its tensors, until the next
        ``advance``, which on a rarely used communicator may be long after (a model's
        worth of memory after DDP's first broadcast)."""
        with self.lock:
            self._issued = [piece for piece in self._issued if not piece.done]

    def issue_all(self) -> None:
        """Issue every started operation as soon as its data is ready.

        On a GPU the gradient hooks run ahead of the kernels they queue, so at the end of
        backward most buckets are still waiting for their events. Polling the events
        while driving MPI on the issued requests lets each bucket's reduction start the
        moment its own data is ready; blocking on one event after another would leave
        MPI idle meanwhile.

        .. warning:: Synchronization point with the producing streams.
        """
        backoff = Backoff()
        while self._unissued:
            waiting = len(self._unissued)
            self.advance()
            if len(self._unissued) < waiting:
                backoff.reset()  # a piece went out: the next one's event may be done too
            else:
                backoff.pause()

    def complete_issued(self) -> None:
        """Wait until every operation issued so far (MPI's, or hpcddp's own ring) has
        completed, in one wait handed to the MPI thread, which drives the rings and notes
        when each operation completes (a transfer's timeline span ends then). The
        transfers' ``wait`` then find their pieces done: DDP's end of backward waits for
        its buckets at once, not one hand-over each.

        .. warning:: Synchronization point: every rank must issue these operations.
        """
        with self.lock:
            self._raise_failure()
            pieces = [piece for piece in self._issued if not piece.done]
        if not pieces:
            return
        ended = {}

        def all_done():  # on the MPI thread, which also runs hpcddp's own (a ring's) steps
            for k, piece in enumerate(pieces):
                if k not in ended and _test(piece.request):
                    ended[k] = timeline.now()
            return len(ended) == len(pieces)
        # Watched as a wait in the oldest operation: the one every rank issued first.
        first = pieces[0]
        with activity.waiting(first.name, None if first.seq is None else self.channel,
                              first.seq, first.call):
            serial.until(all_done, nudge=True)
        with self.lock:
            for k, piece in enumerate(pieces):
                if not piece.done:
                    piece.completed(ended[k])

    def blocking(self, collective: Callable[[], Any]) -> Any:
        """Run ``collective``, a blocking collective on this transport's communicator, in
        start order: every operation started before it is issued first.

        On a GPU an operation started earlier may still wait for its data; issued after
        the blocking one on a rank whose event was late and before it on another, the two
        would match the wrong collectives across ranks.

        .. warning:: Synchronization point with the producing streams; collective.
        """
        self.issue_all()  # the wait for events, without holding the lock
        with self.lock:
            self.issue_all()  # whatever was started meanwhile
        # Not under the lock: the MPI thread's nudges must move this transport's rings
        # while the collective waits. Operations on it start on the training thread only
        # (autograd's thread on a GPU, while the training thread waits in backward), so
        # none can start between here and the collective's issue.
        return collective()

    def issue_through(self, piece: Piece) -> None:
        """Issue every piece up to and including ``piece``, blocking on their events.

        .. warning:: Synchronization point with the producing streams.
        """
        with self.lock:
            while piece.request is None:
                head = self._unissued.popleft()
                head.wait_ready()
                self._issue(head)

    def pending(self) -> int:
        """Pieces started but not yet issued."""
        return len(self._unissued)

    def close(self) -> None:
        """Free what this transport made for itself (the collective check's communicator,
        the node-aware allreduce's).

        .. warning:: Collective where ``HPCDDP_DEBUG=detail``.
        """
        serial.stop_moving(self)
        if self.check is not None:
            self.check.close()
        self.reductions.free()


def _test(request) -> bool:
    """Whether ``request``, MPI's or hpcddp's own (a ring), has completed; never blocks."""
    return MPI.Request.Test(request) if isinstance(request, MPI.Request) else request.Test()


def _dtype(tensor) -> str:
    return str(tensor.dtype)[6:]


def _shape(tensor) -> str:
    return f"{_dtype(tensor)}{list(tensor.shape)}"
