"""``IssueQueue``: the pieces of a communicator's operations, issued in start order.

MPI requires every rank to issue collectives on a communicator in the same order. On a
GPU a tensor may be started before its data is ready (a gradient hook runs ahead of the
kernels it queued), so pieces wait in a queue and are issued strictly in start order,
each once its data is ready, however their events complete, while the bytes in flight
stay within a bound. ``advance()`` issues what it can and ``Test``s what is in flight
(MPI makes no progress while Python computes); it never blocks.

Its MPI calls are made by hpcddp's MPI thread (``hpcddp.comm.serial``) and its queues are
guarded by ``hpcddp.comm.serial.LOCK``, so the futures' thread (``hpcddp.comm.progress_thread``)
may complete transfers while the caller starts new ones, and the MPI thread's nudges
(``serial.keep_moving``) move them while the caller waits elsewhere.
"""

from collections import deque
from typing import Any, Callable, Deque, List, Optional

from mpi4py import MPI

from hpcddp import timeline
from hpcddp.comm import activity, serial
from hpcddp.comm.backoff import Backoff
from hpcddp.env import get_setting
from hpcddp.transport.transfer import Piece

__all__ = ["IssueQueue"]


class IssueQueue:
    """Issues the pieces started on ``comm`` in start order (``Transport``'s base).

    Args:
        comm: the communicator; nothing else may issue collectives on it.
        inflight_bytes: the most bytes of host memory in issued, uncompleted pieces
            (device buffers are not counted); a piece that would pass it waits its turn
            until earlier ones complete (one may always be in flight). None:
            ``HPCDDP_INFLIGHT_MB``; 0: no bound.
    """

    def __init__(self, comm, inflight_bytes: Optional[int] = None):
        self.inflight_bytes = get_setting("INFLIGHT_MB") << 20 if inflight_bytes is None \
            else inflight_bytes
        self.channel = activity.channel_for(comm)
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

    def _enqueue(self, pieces) -> None:
        """Queue ``pieces`` behind every piece started before them (the caller holds
        ``lock``)."""
        self._unissued.extend(pieces)
        self.advance()

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

    def close(self) -> None:
        """No more nudges from the MPI thread."""
        serial.stop_moving(self)



def _test(request) -> bool:
    """Whether ``request``, MPI's or hpcddp's own (a ring), has completed; never blocks."""
    return MPI.Request.Test(request) if isinstance(request, MPI.Request) else request.Test()
