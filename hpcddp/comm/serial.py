"""Every MPI call hpcddp makes goes to one thread, the owner (``hpcddp.comm.owner``).

hpcddp's helper threads (the watchdog, the thread that completes futures, the progress
pump during backward) need MPI while the main thread trains. ``MPI_THREAD_MULTIPLE``
allows two threads inside MPI at once, but it is the least tested path of every MPI
(MPICH 5 with UCX over TCP has crashed with SIGSEGV when a link failed under two
threads), and ``MPI_THREAD_SERIALIZED``, what Cray MPICH provides by default, forbids it.
So no thread but the owner enters MPI:

- hpcddp's communicators are ``SerialComm``s: each method and attribute is a call
  handed to the owner. The communicators they make are ``SerialComm``s, the requests
  they return ``SerialRequest``s.
- A wait is handed over whole: ``SerialRequest.Wait`` and the blocking buffer
  collectives (``Barrier``, ``Bcast``, ``Allreduce`` ... run as ``Ibarrier``, ``Ibcast``,
  ``Iallreduce``) are polled by the owner between its other calls, and the waiting
  thread sleeps until it completes, so the watchdog still asks the other ranks while
  the main thread waits. Each blocking collective counts itself on its communicator's
  channel and is a wait the watchdog sees (``activity.collective``), whoever calls it.
- MPI calls on other objects (``MPI.Request.Testall`` on a list, a ``Message``, a file)
  go through ``call``; ``wait`` and ``wait_all`` wait for requests.

The pickle-based collectives (``bcast``, ``allgather``, ``gather``, ``scatter``,
``alltoall``, ``allreduce``, ``reduce``) run as a nonblocking collective of the pickles'
sizes and one of their bytes, each waited for the same way; ``recv`` polls a matched
probe and ``Dup`` runs as ``Idup``. The other ways to make a communicator (``Split``,
``Create_group``) have no nonblocking form and keep the owner until they return. Code
outside hpcddp that calls MPI while hpcddp runs hands its calls to the owner too
(``hpcddp.mpi_call(comm.Iprobe)``).

``LOCK`` guards the state of hpcddp's operations in flight (a transport's queues, a
handle's completion), which the training thread, the futures' thread and the owner's
nudges (``keep_moving``) share; the owner never waits for it.
"""

import functools
import itertools
import threading
import weakref
from array import array
from typing import Any, Callable, List, Optional, Sequence

from mpi4py import MPI

from hpcddp.comm import activity
from hpcddp.comm.backoff import mpi_polls
from hpcddp.comm.owner import OWNER, OwnerBusy

__all__ = ["LOCK", "OwnerBusy", "SerialComm", "SerialRequest", "call", "keep_moving",
           "live_comms", "moved", "poll", "post", "serialize", "stop_moving", "until",
           "wait", "wait_all", "wake"]

LOCK = threading.RLock()


def call(fn: Callable, *args, timeout: Optional[float] = None, **kwargs) -> Any:
    """``fn(*args, **kwargs)``, an MPI call, made by the owner thread; its result.

    Args:
        timeout: seconds the owner may take to start it (``OwnerBusy`` after that);
            None: as long as it takes.
    """
    if kwargs:
        fn = functools.partial(fn, **kwargs)
    return OWNER.call(fn, *args, timeout=timeout)


def post(step: Callable[[], Any], patient: bool = False) -> bool:
    """Have the owner call ``step()`` until it returns something true, without waiting
    (``Owner.post``); False where the caller must make its own calls."""
    return OWNER.post(step, patient)


def moved() -> None:
    """From a step posted with ``patient``, on the MPI thread: it got something done
    (``Owner.moved``)."""
    OWNER.moved()


mpi_call = call  # its public name: ``hpcddp.mpi_call(comm.Iprobe)``

_MOVING = weakref.WeakSet()  # objects whose nudge() the waits below call


def keep_moving(obj) -> None:
    """Have ``obj.nudge()`` called between the polls of every blocking collective and
    request wait on hpcddp's communicators, for as long as ``obj`` lives.

    Some operations move only when Python calls them: hpcddp's ring and node-aware
    allreduce post each step's messages once the last step's have arrived. A rank
    blocked in another wait (the end-of-backward agreement, say) would leave them
    standing, and the other ranks' part of that wait may be behind them (a ``Join``
    notice of three ranks ahead of a joined rank's shadow backward did exactly that).
    ``nudge`` runs on the owner: it must never block and never wait for a lock.
    """
    _MOVING.add(obj)


def stop_moving(obj) -> None:
    """No more nudges for ``obj`` (closed: nothing of it is in flight)."""
    _MOVING.discard(obj)


def _nudge_all() -> None:
    for obj in list(_MOVING):
        obj.nudge()


OWNER.nudge = _nudge_all


def poll(done: Callable[[], Any], nudge: bool = False) -> Any:
    """Call ``done`` on the calling thread until it returns something true, and return
    that: a wait whose test does more than MPI (it takes ``LOCK``, or completes
    hpcddp's own operations); its MPI calls go through ``call``. The pauses are
    ``mpi_polls()``'s; with ``nudge``, the objects given to ``keep_moving`` are nudged
    between polls."""
    polls = mpi_polls()
    while True:
        result = done()
        if result:
            return result
        if nudge:
            _nudge_all()
        polls.pause()


def until(done: Callable[[], Any], nudge: bool = False) -> Any:
    """Have the MPI thread poll ``done()``, MPI tests that never block and take no lock,
    until it returns something true; return that. With ``nudge``, as ``wait``."""
    return OWNER.until(done, nudge)


def wake() -> None:
    """Have the MPI thread poll the waits handed to ``until`` now (``Owner.wake``)."""
    OWNER.wake()


def wait(request: "MPI.Request", status: Optional["MPI.Status"] = None,
         nudge: bool = False) -> None:
    """Complete ``request``: the owner tests it between its other calls."""
    OWNER.until(functools.partial(MPI.Request.Test, request, status), nudge)


def wait_all(requests: Sequence["MPI.Request"], statuses=None, nudge: bool = False) -> None:
    """Complete every one of ``requests`` (``MPI_Waitall``, polled by the owner)."""
    OWNER.until(functools.partial(MPI.Request.Testall, list(requests), statuses), nudge)


def _wrap(result):
    """Communicators and requests made by a wrapped call, wrapped in turn."""
    if isinstance(result, MPI.Intracomm) and result != MPI.COMM_NULL:
        if isinstance(result, SerialComm):
            result._fixed()  # made by mpi4py as type(self), without __init__
            return result
        return call(SerialComm, result)  # mpi4py asks MPI whether it is an intracomm
    if type(result) is MPI.Request:
        return SerialRequest(result)
    if type(result) is tuple and any(isinstance(i, (MPI.Comm, MPI.Request)) for i in result):
        return tuple(_wrap(item) for item in result)  # Idup's (communicator, request)
    return result


def _locked(base):
    def method(self, *args, **kwargs):
        return _wrap(call(base, self, *args, **kwargs))
    method.__name__ = method.__qualname__ = base.__name__
    method.__doc__ = base.__doc__
    return method


def _locked_property(descriptor):
    def get(self):
        return call(descriptor.__get__, self, type(self))
    return property(get, doc=descriptor.__doc__)


def _polled(name, nonblocking):
    def method(self, *args, **kwargs):
        _polled_call(nonblocking, self, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    return method


def _counted(method):
    """``method``, a blocking collective, counted and waited in for the watchdog
    (``activity.collective``): every rank counts the same collectives, so no caller has
    to."""
    name = method.__name__

    @functools.wraps(method)
    def counted(self, *args, **kwargs):
        with activity.collective(self, name):
            return method(self, *args, **kwargs)
    return counted


def _handed_over(base, polled=None):
    """Class decorator: every instance method and attribute of ``base`` that the class
    does not define itself (or through a base of its own) becomes a call the owner
    makes; each of ``polled``'s blocking operations runs as its nonblocking form, waited
    for by the owner. ``Abort`` is not handed over: ``hpcddp.faults.abort`` decides."""
    def decorate(cls):
        own = {name for klass in cls.__mro__ if klass not in base.__mro__
               for name in vars(klass)}
        for klass in reversed(base.__mro__[:-1]):
            for name, attr in vars(klass).items():
                if (name.startswith("__") or name in own or name == "Abort"
                        or isinstance(attr, classmethod)):
                    continue
                if type(attr).__name__ == "getset_descriptor":
                    setattr(cls, name, _locked_property(attr))
                elif callable(attr):
                    setattr(cls, name, _locked(attr))
        for blocking, nonblocking in (polled or {}).items():
            method = _polled(blocking, getattr(base, nonblocking))
            setattr(cls, blocking, method if blocking == "Send" else _counted(method))
        return cls
    return decorate


# Blocking buffer collectives and their nonblocking forms, whose arguments are the same.
_POLLED = {"Barrier": "Ibarrier", "Bcast": "Ibcast", "Allreduce": "Iallreduce",
           "Allgather": "Iallgather", "Allgatherv": "Iallgatherv", "Reduce": "Ireduce",
           "Gather": "Igather", "Gatherv": "Igatherv", "Scatter": "Iscatter",
           "Scatterv": "Iscatterv", "Alltoall": "Ialltoall", "Alltoallv": "Ialltoallv",
           "Reduce_scatter_block": "Ireduce_scatter_block", "Send": "Isend", "barrier": "Ibarrier"}


def _polled_call(nonblocking, *args, **kwargs) -> None:
    """Start a nonblocking operation and wait for it, in one wait handed to the owner."""
    started = []

    def done():
        if not started:
            started.append(nonblocking(*args, **kwargs))
        return MPI.Request.Test(started[0])
    OWNER.until(done, nudge=True)


def _offsets(sizes) -> List[int]:
    """Where each of ``sizes`` starts, packed one after another."""
    return [0, *itertools.accumulate(sizes)][:len(sizes)]


def _split(data: bytearray, sizes) -> List[Any]:
    return [MPI.pickle.loads(data[start:start + size]) if size else None
            for start, size in zip(_offsets(sizes), sizes)]


class _Pickled:
    """mpi4py's pickle-based collectives as two nonblocking collectives each (sizes, then
    bytes), every call and every wait handed to the owner. Each returns what
    mpi4py's would; the reductions combine the values in rank order on every rank."""

    @_counted
    def bcast(self, obj=None, root: int = 0):
        data = bytearray(MPI.pickle.dumps(obj)) if self.rank == root else bytearray()
        size = array("q", [len(data)])
        _polled_call(MPI.Intracomm.Ibcast, self, [size, MPI.INT64_T], root=root)
        if self.rank != root:
            data = bytearray(size[0])
        _polled_call(MPI.Intracomm.Ibcast, self, [data, MPI.BYTE], root=root)
        return MPI.pickle.loads(data)

    @_counted
    def allgather(self, obj) -> List[Any]:
        mine = MPI.pickle.dumps(obj)
        sizes = array("q", [0] * self.size)
        _polled_call(MPI.Intracomm.Iallgather, self, [array("q", [len(mine)]), MPI.INT64_T],
                     [sizes, MPI.INT64_T])
        data = bytearray(sum(sizes))
        _polled_call(MPI.Intracomm.Iallgatherv, self, [mine, MPI.BYTE],
                     [data, (list(sizes), _offsets(sizes)), MPI.BYTE])
        return _split(data, sizes)

    @_counted
    def gather(self, obj, root: int = 0) -> Optional[List[Any]]:
        mine, is_root = MPI.pickle.dumps(obj), self.rank == root
        sizes = array("q", [0] * self.size)
        _polled_call(MPI.Intracomm.Igather, self, [array("q", [len(mine)]), MPI.INT64_T],
                     [sizes, MPI.INT64_T] if is_root else None, root=root)
        data = bytearray(sum(sizes))
        _polled_call(MPI.Intracomm.Igatherv, self, [mine, MPI.BYTE],
                     [data, (list(sizes), _offsets(sizes)), MPI.BYTE] if is_root else None,
                     root=root)
        return _split(data, sizes) if is_root else None

    @_counted
    def scatter(self, objs=None, root: int = 0):
        is_root = self.rank == root
        pieces = [MPI.pickle.dumps(o) for o in objs] if is_root else []
        if is_root and len(pieces) != self.size:
            raise ValueError(f"scatter: expecting {self.size} items, got {len(pieces)}")
        sizes = array("q", [len(p) for p in pieces])
        size = array("q", [0])
        _polled_call(MPI.Intracomm.Iscatter, self, [sizes, MPI.INT64_T] if is_root else None,
                     [size, MPI.INT64_T], root=root)
        data = bytearray(size[0])
        _polled_call(MPI.Intracomm.Iscatterv, self,
                     [b"".join(pieces), (list(sizes), _offsets(sizes)), MPI.BYTE]
                     if is_root else None, [data, MPI.BYTE], root=root)
        return MPI.pickle.loads(data)

    @_counted
    def alltoall(self, objs) -> List[Any]:
        pieces = [MPI.pickle.dumps(o) for o in objs]
        if len(pieces) != self.size:
            raise ValueError(f"alltoall: expecting {self.size} items, got {len(pieces)}")
        out_sizes = array("q", [len(p) for p in pieces])
        in_sizes = array("q", [0] * self.size)
        _polled_call(MPI.Intracomm.Ialltoall, self, [out_sizes, MPI.INT64_T],
                     [in_sizes, MPI.INT64_T])
        data = bytearray(sum(in_sizes))
        _polled_call(MPI.Intracomm.Ialltoallv, self,
                     [b"".join(pieces), (list(out_sizes), _offsets(out_sizes)), MPI.BYTE],
                     [data, (list(in_sizes), _offsets(in_sizes)), MPI.BYTE])
        return _split(data, in_sizes)

    @_counted
    def allreduce(self, obj, op=MPI.SUM):
        return functools.reduce(op, self.allgather(obj))

    @_counted
    def reduce(self, obj, op=MPI.SUM, root: int = 0):
        values = self.gather(obj, root=root)
        return None if values is None else functools.reduce(op, values)

    @_counted
    def Dup(self, info=None):  # noqa: N802 - MPI's name
        comm, request = call(MPI.Intracomm.Idup, self, info)
        wait(request, nudge=True)
        return _wrap(comm)

    def send(self, obj, dest: int, tag: int = 0) -> None:
        _polled_call(MPI.Intracomm.isend, self, obj, dest=dest, tag=tag)

    def recv(self, buf=None, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
             status: Optional["MPI.Status"] = None):
        """A matched probe, polled by the owner until the message is there."""
        def received():
            message = MPI.Intracomm.improbe(self, source, tag, status)
            return None if message is None else (message.recv(status=status),)
        return OWNER.until(received)[0]


@_handed_over(MPI.Intracomm, polled=_POLLED)
class SerialComm(_Pickled, MPI.Intracomm):
    """An intracommunicator whose calls the owner makes (``SerialComm(comm)`` shares
    ``comm``'s handle). Its blocking collectives count themselves for the watchdog."""

    def __init__(self, comm=None):
        self._fixed()

    def _fixed(self):
        """Rank and size, fixed for the communicator's life, read once by the owner and
        then kept (a report before ``MPI_Abort`` may find the owner stuck in a call).
        mpi4py makes the results of ``Dup`` and the like with ``type(self)``, without
        ``__init__``, so they are read on first use."""
        fixed = self.__dict__.get("_rank_size")
        if fixed is None:
            fixed = call(MPI.Intracomm.Get_rank, self), call(MPI.Intracomm.Get_size, self)
            self.__dict__["_rank_size"] = fixed
            _LIVE[id(self)] = self
        return fixed

    rank = property(lambda self: self._fixed()[0], doc="This process's rank.")
    size = property(lambda self: self._fixed()[1], doc="The number of processes.")

    def Get_rank(self) -> int:  # noqa: N802 - MPI's name
        return self._fixed()[0]

    def Get_size(self) -> int:  # noqa: N802 - MPI's name
        return self._fixed()[1]

    def Free(self) -> None:  # noqa: N802 - MPI's name
        """Free the communicator; its channel's counts stay in reports (``forget``)."""
        activity.forget(self)
        call(MPI.Comm.Free, self)


_LIVE: "weakref.WeakValueDictionary[int, SerialComm]" = weakref.WeakValueDictionary()


def live_comms() -> List[SerialComm]:
    """Every communicator wrapped here that is still referenced and not freed (what a
    recovery revokes: ``hpcddp.faults.failed``)."""
    return [comm for comm in list(_LIVE.values()) if comm != MPI.COMM_NULL]


@_handed_over(MPI.Request)
class SerialRequest(MPI.Request):
    """A request whose calls the owner makes; ``Wait`` and ``wait`` (the pickle form)
    are polled by the owner."""

    def Wait(self, status: Optional["MPI.Status"] = None) -> bool:  # noqa: N802 - MPI's name
        wait(self, status, nudge=True)
        return True

    def wait(self, status: Optional["MPI.Status"] = None):
        def received():
            done, message = MPI.Request.test(self, status)
            return (message,) if done else None
        return OWNER.until(received, nudge=True)[0]


def serialize(comm: "MPI.Intracomm") -> "SerialComm":
    """``comm`` as a ``SerialComm`` (itself if it is one already)."""
    return _wrap(comm)
