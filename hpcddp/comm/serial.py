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
  go through ``call``; ``wait`` and ``wait_all`` wait for requests (``handover.py``,
  whose names this module gives too).

The pickle-based collectives (``bcast``, ``allgather`` ...: ``pickled.py``) run as a
nonblocking collective of the pickles' sizes and one of their bytes, each waited for
the same way; ``Dup`` runs as ``Idup``. The other ways to make a communicator (``Split``,
``Create_group``) have no nonblocking form and keep the owner until they return. Code
outside hpcddp that calls MPI while hpcddp runs hands its calls to the owner too
(``hpcddp.mpi_call(comm.Iprobe)``).
"""


import weakref
from typing import List, Optional

from mpi4py import MPI

from hpcddp.comm import activity
# The calls and waits handed to the owner, named here too: hpcddp calls them serial.*.
from hpcddp.comm.handover import (LOCK, OwnerBusy, call, counted, keep_moving, moved,
                                  mpi_call, poll, polled_call, post, stop_moving, until, wait,
                                  wait_all, wake)
from hpcddp.comm.owner import OWNER
from hpcddp.comm.pickled import PickledCollectives

__all__ = ["LOCK", "OwnerBusy", "SerialComm", "SerialRequest", "call", "keep_moving",
           "live_comms", "made_live", "moved", "mpi_call", "poll", "post", "serialize",
           "stop_moving", "until", "wait", "wait_all", "wake"]


def _wrap(result, made: bool = True):
    """Communicators and requests made by a wrapped call, wrapped in turn; a
    communicator whose making is still pending (not ``made``) is not yet live."""
    if isinstance(result, MPI.Intracomm) and result != MPI.COMM_NULL:
        if not isinstance(result, SerialComm):  # (else made by mpi4py as type(self))
            result = call(SerialComm, result)  # mpi4py asks MPI whether it is an intracomm
        result._fixed()
        if not made:
            _LIVE.pop(id(result), None)
        return result
    if type(result) is MPI.Request:
        return SerialRequest(result)
    if type(result) is tuple and any(isinstance(i, (MPI.Comm, MPI.Request)) for i in result):
        # Idup's (communicator, request): the communicator is live once it completes
        return tuple(_wrap(item, made=False) for item in result)
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
        polled_call(nonblocking, self, *args, **kwargs)
    method.__name__ = method.__qualname__ = name
    return method


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
            setattr(cls, blocking, method if blocking == "Send" else counted(method))
        return cls
    return decorate


# Blocking buffer collectives and their nonblocking forms, whose arguments are the same.
_POLLED = {"Barrier": "Ibarrier", "Bcast": "Ibcast", "Allreduce": "Iallreduce",
           "Allgather": "Iallgather", "Allgatherv": "Iallgatherv", "Reduce": "Ireduce",
           "Gather": "Igather", "Gatherv": "Igatherv", "Scatter": "Iscatter",
           "Scatterv": "Iscatterv", "Alltoall": "Ialltoall", "Alltoallv": "Ialltoallv",
           "Reduce_scatter_block": "Ireduce_scatter_block", "Send": "Isend", "barrier": "Ibarrier"}


@_handed_over(MPI.Intracomm, polled=_POLLED)
class SerialComm(PickledCollectives, MPI.Intracomm):
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
            made_live(self)
        return fixed

    rank = property(lambda self: self._fixed()[0], doc="This process's rank.")
    size = property(lambda self: self._fixed()[1], doc="The number of processes.")

    def Get_rank(self) -> int:  # noqa: N802 - MPI's name
        return self._fixed()[0]

    def Get_size(self) -> int:  # noqa: N802 - MPI's name
        return self._fixed()[1]

    @counted
    def Dup(self, info=None):  # noqa: N802 - MPI's name
        comm, request = call(MPI.Intracomm.Idup, self, info)
        wait(request, nudge=True)
        return _wrap(comm)

    def Free(self) -> None:  # noqa: N802 - MPI's name
        """Free the communicator; its channel's counts stay in reports (``forget``)."""
        activity.forget(self)
        call(MPI.Comm.Free, self)


_LIVE: "weakref.WeakValueDictionary[int, SerialComm]" = weakref.WeakValueDictionary()


def made_live(comm: SerialComm) -> None:
    """``comm``, whose making has completed, is one ``live_comms`` gives. One made by
    ``Idup`` is live only once its request completes: Open MPI 5.0's ``MPIX_Comm_revoke``
    on a communicator still being made dereferences its unset matching state (SIGSEGV
    in ``mca_pml_ob1_revoke_comm``, seen in a recovery's rebuild)."""
    _LIVE[id(comm)] = comm


def live_comms() -> List[SerialComm]:
    """Every communicator made here that is still referenced and not freed (what a
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
