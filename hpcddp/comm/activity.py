"""What this rank is doing in MPI, kept cheaply so the watchdog can tell where a job is stuck.

Every communicator hpcddp issues collectives on has a ``Channel`` that counts them. All
members issue the same collectives on a communicator in the same order (MPI requires
it), so the count is a sequence number that means the same on every rank: a rank whose
count is below the number of the collective another rank waits in has not reached it.
Each blocking wait is entered here (``waiting``) with the operation's name, channel and
number, and left when it returns. The blocking collectives of hpcddp's communicators
(``SerialComm``) count and enter themselves (``collective``), so no caller has to wrap
them; a caller may name them for the reports (``named``). The watchdog (``watchdog.py``) reads this from its own
thread; the main thread only writes a few attributes, so the cost on a healthy step is
a handful of attribute stores per collective.
"""

import collections
import itertools
import os
import sys
import threading
import time
import traceback
from typing import Deque, Dict, List, Optional, Tuple

from mpi4py import MPI

from hpcddp.comm.owner import OWNER

__all__ = ["Channel", "channel_for", "collective", "current_waits", "forget", "main_stack",
           "named", "set_reference", "share", "snapshot", "waited", "waiting"]

_RECENT = 8  # collectives a channel remembers, for a report's different collectives


class Channel:
    """The collectives issued on one communicator, counted.

    Attributes:
        name: the same on every member ("DDP model #0").
        members: the members' ranks in the hpcddp world.
        count: collectives issued so far; the last one's sequence number.
        step: for a DDP model, the synchronized backward passes started so far.
        recent: the last few collectives issued, (number, call): a rank that went past
            a collective that another rank waits in tells what it issued there (an MPI
            may complete a broadcast with an allreduce's message).
    """

    __slots__ = ("name", "members", "count", "step", "recent")

    def __init__(self, name: str, members: Tuple[int, ...]):
        self.name, self.members = name, members
        self.count = self.step = 0
        self.recent: Deque[Tuple[int, str]] = collections.deque(maxlen=_RECENT)

    def begin_step(self) -> None:
        """Count one synchronized backward pass of a DDP model, started now."""
        self.step += 1

    def issue(self, what: str, call: Optional[str] = None) -> int:
        """Count one collective, ``what``, issued now; return its sequence number.
        ``call`` describes it the same way on every rank where ``what`` does not."""
        self.count += 1
        _state.last = (what, self.name, self.count)
        self.recent.append((self.count, call or what))
        return self.count


class _State:
    def __init__(self):
        self.channels: Dict[int, Channel] = {}   # id(comm) -> its channel
        self.closed: Dict[str, Tuple[int, int]] = {}  # a freed channel's name -> (count, step)
        self.numbers: Dict[tuple, itertools.count] = {}
        self.waits: Dict[int, List["_Wait"]] = {}  # thread ident -> waits, innermost last
        self.waited = 0.0  # seconds the main thread has spent in waits (outermost only)
        self.last: Optional[tuple] = None        # (what, channel name, number) last issued
        self.reference = None                    # the group whose ranks reports use
        self.lock = threading.Lock()


_state = _State()
_MAIN = threading.main_thread().ident
# The main thread's hand-overs to hpcddp's MPI thread outside its waits count as waits.
OWNER.counted = lambda: not _state.waits.get(_MAIN)


def set_reference(comm) -> None:
    """Report ranks as ranks of ``comm`` (the hpcddp world); None: COMM_WORLD."""
    _state.reference = None if comm is None else OWNER.call(MPI.Comm.Get_group, comm)


def _members(comm) -> Tuple[int, ...]:
    return OWNER.call(_translated, comm, _state.reference)


def _translated(comm, reference) -> Tuple[int, ...]:
    """``comm``'s ranks as ranks of ``reference`` (on hpcddp's MPI thread)."""
    reference = reference or MPI.COMM_WORLD.Get_group()
    group = MPI.Comm.Get_group(comm)
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(MPI.Comm.Get_size(comm))),
                                          reference)
    finally:
        group.Free()
    return tuple(ranks)


def channel_for(comm, kind: Optional[str] = None) -> Channel:
    """The channel of ``comm``, made on first use and named ``"<kind> #k"``.

    Names are numbered per kind and member set in the order channels are made, which is
    the same on every member: communicators are made collectively.
    """
    channel = _state.channels.get(id(comm))
    if channel is not None:
        return channel
    members = _members(comm)
    kind = kind or comm.Get_name() or "communicator"
    with _state.lock:
        number = next(_state.numbers.setdefault((kind, members), itertools.count()))
        channel = _state.channels[id(comm)] = Channel(f"{kind} #{number}", members)
    return channel


def share(comm, channel: Channel) -> Channel:
    """Count ``comm``'s collectives on ``channel`` too: a second communicator that the same
    owner issues on in program order (a DDP model's control messages beside its buckets)."""
    _state.channels[id(comm)] = channel
    return channel


def forget(comm) -> None:
    """``comm`` is being freed: a new communicator may reuse its id. Its final counts stay
    in reports: a rank that destroyed a group and left had still issued its collectives,
    and another rank finishing the last of them must not read it as never reached."""
    channel = _state.channels.pop(id(comm), None)
    if channel is not None:
        with _state.lock:
            _state.closed[channel.name] = (channel.count, channel.step)


class _Wait:
    """One blocking wait in progress."""

    __slots__ = ("name", "channel", "seq", "call", "since", "thread", "warned")

    def __init__(self, name: str, channel: Optional[Channel], seq: Optional[int],
                 call: Optional[str] = None):
        self.name, self.channel, self.seq = name, channel, seq
        self.call = call or name  # what every rank must agree on (no rank-specific text)
        self.since = time.monotonic()
        self.thread = threading.get_ident()
        self.warned = False

    def __enter__(self):
        self.since = time.monotonic()
        _state.waits.setdefault(self.thread, []).append(self)
        return self

    def __exit__(self, *exc):
        stack = _state.waits.get(self.thread)
        if stack:
            stack.pop()
            if not stack and self.thread == _MAIN:  # an outermost wait of the main thread
                _state.waited += time.monotonic() - self.since
        return False

    def describe(self) -> str:
        if self.channel is None:
            return self.name
        return f"{self.name} (collective {self.seq} on {self.channel.name})"

    def as_dict(self) -> dict:
        return {"what": self.describe(), "call": self.call, "channel": self.channel and self.channel.name,
                "seq": self.seq, "seconds": round(time.monotonic() - self.since, 1),
                "thread": _thread_name(self.thread)}


def waiting(name: str, channel: Optional[Channel] = None, seq: Optional[int] = None,
            call: Optional[str] = None) -> _Wait:
    """A context for a blocking wait in collective ``seq`` of ``channel`` (or in ``name``
    alone, when it is no numbered collective); ``call`` describes it the same way on
    every rank where ``name`` does not."""
    return _Wait(name, channel, seq, call)


class _Local(threading.local):
    name: Optional[str] = None  # the caller's name for the collectives it makes (named)
    inside = False              # in a counted collective: what it calls is part of it


_local = _Local()
_COMM_DIR = os.path.dirname(os.path.abspath(__file__))


class named:
    """Name the blocking collectives made inside, in the watchdog's reports (rather
    than by the MPI method and the code that called it). The name must read the same on
    every rank.

    Example::

        with activity.named("DDP bucket order from rank 0"):
            order = control.bcast(observed, root=0)
    """

    __slots__ = ("name", "previous")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.previous, _local.name = _local.name, self.name
        return self

    def __exit__(self, *exc):
        _local.name = self.previous
        return False


class collective:
    """The one wait of a blocking collective ``method`` of a ``SerialComm``: counted on
    ``comm``'s channel and entered, at the outermost such call of the thread (a pickled
    ``bcast`` is two ``Ibcast``s, a pickled ``allreduce`` an ``allgather``: one each)."""

    __slots__ = ("wait",)

    def __init__(self, comm, method: str):
        if _local.inside:
            self.wait = None
            return
        channel = channel_for(comm)
        name = _local.name or f"{method} from {_caller()}"
        self.wait = _Wait(name, channel, channel.issue(name))

    def __enter__(self):
        if self.wait is not None:
            _local.inside = True
            self.wait.__enter__()
        return self

    def __exit__(self, *exc):
        if self.wait is not None:
            _local.inside = False
            self.wait.__exit__(*exc)
        return False


def _caller() -> str:
    """The first function outside ``hpcddp.comm`` on this thread's stack, ``module:name``
    (the same on every rank, where a line of the user's code would be too)."""
    frame = sys._getframe(2)
    while frame is not None and os.path.dirname(frame.f_code.co_filename) == _COMM_DIR:
        frame = frame.f_back
    if frame is None:
        return "hpcddp.comm"
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_qualname}"


def waited() -> float:
    """Seconds the main thread has spent waiting in hpcddp so far (nested waits once),
    its hand-overs to hpcddp's MPI thread included."""
    return _state.waited + OWNER.main_blocked


def current_waits() -> List[_Wait]:
    """Every wait in progress, on any thread (a copy)."""
    return [wait for stack in list(_state.waits.values()) for wait in list(stack)]


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return thread.name
    return str(ident)


def main_stack(limit: int = 12) -> str:
    """The main thread's Python stack, innermost last (what a rank in user code runs)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "(the main thread has ended)\n"
    return "".join(traceback.format_stack(frame, limit=limit))


def _closed_channels() -> Dict[str, Tuple[int, int]]:
    with _state.lock:
        return dict(_state.closed)


def snapshot(stack: bool = True) -> dict:
    """This rank's state for a report: channel counts, waits, last collective, stack."""
    waits = current_waits()
    main = threading.main_thread().ident
    return {
        "channels": dict(_closed_channels(),
                         **{c.name: (c.count, c.step) for c in list(_state.channels.values())}),
        "waits": [wait.as_dict() for wait in waits],
        "last": _state.last,
        "recent": {c.name: list(c.recent) for c in list(_state.channels.values())},
        "in_user_code": not any(wait.thread == main for wait in waits),
        "stack": main_stack() if stack else "",
    }
