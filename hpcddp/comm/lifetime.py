"""Who releases what, and in which order, before MPI is finalized.

Some MPI resources must be released before ``MPI_Finalize``, several of them
collectively: a communicator from ``Dup()``, a file opened with MPI-IO, a helper thread
that calls MPI. Each belongs to one owner with a ``close()``. Owners register here while
open, so that one exit path, ``close_all()``, closes whatever is still open, newest
first. ``hpcddp.shutdown()`` runs it, the preemption path runs it before finalizing,
and so does interpreter exit, before mpi4py finalizes MPI.
"""

import atexit
import threading
import weakref
from typing import Dict

from mpi4py import MPI

from hpcddp.comm.owner import OWNER

__all__ = ["Closable", "abandon_all", "before_finalize", "close_all", "free_comm", "open_count",
           "open_owners", "register", "unregister"]

_open: Dict[int, object] = {}  # insertion order is opening order, the same on every rank
_lock = threading.Lock()


def register(owner, keep_alive: bool = False) -> None:
    """Have ``close_all`` close ``owner`` (anything with ``close()``) if still open.

    Args:
        owner: the object that owns the resource.
        keep_alive: hold ``owner`` until it is closed. For resources whose release is
            collective and must not be left to the garbage collector (an MPI-IO file:
            ranks would close it at different moments and hang). Otherwise the
            registry holds a weak reference and does not extend the owner's life.
    """
    with _lock:
        # An owner may sit at the address of one that died unclosed: dropping the dead
        # first puts the newcomer last, as on every other rank. Overwriting the key
        # would keep the dead one's place, so ranks whose allocators reused different
        # addresses would close collectively in different orders and wait on each other.
        for key in [k for k, o in _open.items() if isinstance(o, weakref.ref) and o() is None]:
            del _open[key]
        _open.pop(id(owner), None)
        _open[id(owner)] = owner if keep_alive else weakref.ref(owner)


def unregister(owner) -> None:
    """``owner`` has closed itself."""
    with _lock:
        _open.pop(id(owner), None)


def open_count() -> int:
    """How many registered owners are still open (and alive)."""
    with _lock:
        return sum(1 for o in _open.values() if not isinstance(o, weakref.ref) or o() is not None)


def open_owners() -> list:
    """The registered owners still open (and alive), oldest first."""
    with _lock:
        found = [o() if isinstance(o, weakref.ref) else o for o in _open.values()]
    return [o for o in found if o is not None]


def close_all() -> None:
    """Close every registered owner, newest first.

    An owner whose ``close()`` raises does not keep the others open: each is closed (the
    other ranks are closing theirs, collectively), then the first error is raised.

    .. warning:: Collective where an owner's ``close()`` is (MPI-IO files,
       communicators): every rank must run it, as every exit path does.
    """
    first = None
    for owner in _newest_first():
        try:
            owner.close()
        except Exception as error:  # noqa: BLE001 - raised once every owner is closed
            first = first or error
    if first is not None:
        raise first


def _newest_first():
    """Each registered owner still alive, newest first, unregistered as it is taken (one
    registered meanwhile is taken too)."""
    while True:
        with _lock:
            if not _open:
                return
            owner = _open.popitem()[1]
        owner = owner() if isinstance(owner, weakref.ref) else owner
        if owner is not None:
            yield owner


def abandon_all() -> None:
    """Let go of every registered owner without a collective or a wait on another rank:
    helper threads stopped, communicators left unfreed (they are revoked). For a
    recovery after a rank died (``hpcddp.elastic``), where a collective would wait for
    it; an owner without ``abandon()`` is only forgotten.
    """
    for owner in _newest_first():
        abandon = getattr(owner, "abandon", None)
        if abandon is not None:
            try:
                abandon()
            except Exception:  # noqa: BLE001 - letting go goes on; nothing is freed
                pass


def before_finalize() -> None:
    """``close_all``, then stop hpcddp's MPI thread: ``MPI_Finalize`` (on the main thread)
    comes next, with no other thread inside MPI or about to enter it.

    .. warning:: Collective, as ``close_all``.
    """
    try:
        close_all()
    finally:
        OWNER.close()


def free_comm(comm) -> None:
    """Free ``comm`` unless it is null or MPI is already finalized."""
    if comm is not None and comm != MPI.COMM_NULL and not MPI.Is_finalized():
        comm.Free()


class Closable:
    """An owner of MPI resources: registered while open, ``close()`` once, then refused.

    Subclasses call ``_opened()`` once their resources exist, implement ``_release()``,
    and call ``_check_open()`` where a closed object must not be used.
    """

    _closed = True
    _what = "object"

    def _opened(self) -> None:
        self._closed = False
        register(self)

    def _release(self) -> None:
        raise NotImplementedError

    def _abandon(self) -> None:
        """``abandon``'s part: stop what runs, free nothing collectively."""

    def abandon(self) -> None:
        """Closed without MPI's collectives (``abandon_all``). Idempotent."""
        self._end(self._abandon)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"hpcddp: this {self._what} is already closed; create a new one")

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release the MPI resources. Collective: every rank must call it. Idempotent."""
        self._end(self._release)

    def _end(self, how) -> None:
        if self._closed:
            return
        self._closed = True
        unregister(self)
        how()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# Python's exit handlers run before mpi4py's MPI_Finalize (a Py_AtExit hook).
atexit.register(before_finalize)
