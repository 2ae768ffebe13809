"""The store of hpcddp's default group: opened by rank 0 when first needed, found through MPI.

hpcddp's ranks find each other through MPI, so its own groups never use a store. But
torch makes every group of another backend through the default group's store: a
``dist.new_group(backend="gloo")`` (a CPU group beside NCCL's, a ``monitored_barrier``,
a library's object collectives) has gloo's ranks swap their addresses there. A store of
each process's own would leave each rank waiting for the others' keys for ever.

So rank 0 serves torch's ``TCPStore``, and only once a rank first uses the store: that
rank asks rank 0 through MPI (``StoreBroker``), rank 0 opens the store then and answers
with its address. A job that makes no group of another backend listens on no port. Rank
0's thread takes the questions a few times a second (``_TICK``): gloo's first use of
the store waits that long. Below ``MPI_THREAD_SERIALIZED`` no thread but the main one may
call MPI, so rank 0 opens the store at ``init()`` instead.

torch's store authenticates nobody: anyone who reaches its port reads and writes its
keys. hpcddp's listens on loopback when every rank shares the node, and across nodes on
the one address rank 0's name resolves to (not on every interface, as a ``TCPStore``
given a host does); and every key is under a prefix of 128 random bits (``PrefixStore``)
that rank 0 sends the ranks through MPI, so a client without it finds none of them.
"""

import secrets
import socket
import threading
from datetime import timedelta
from typing import List, Optional, Tuple, Union

import torch.distributed as dist
from mpi4py import MPI

from hpcddp.comm import activity, serial
from hpcddp.comm.lifetime import Closable, free_comm
from hpcddp.comm.topology import clone_comm

__all__ = ["SharedStore", "StoreBroker", "forget_shared_store", "shared_store"]

_ASK, _WHERE = 1, 2
_TICK = 0.05  # how often rank 0's thread takes the questions
_LOCK_SECONDS = 0.5  # how long that thread waits for the MPI thread to take a call

Where = Union[Tuple[str, int], str]  # (host, port), or why rank 0 could not serve


class StoreBroker(Closable):
    """Rank 0's store, opened on the first question, and the ranks' way to it.

    Args:
        world: the hpcddp ``World``; the broker talks on a clone of its communicator.
        timeout: the store's timeout (a key another rank has not set yet).

    .. warning:: Construction and ``close()`` are collective.
    """

    _what = "hpcddp store"

    def __init__(self, world, timeout: timedelta):
        self.comm = clone_comm(world.comm, "hpcddp.store")
        self.rank, self.size = self.comm.rank, self.comm.size
        self.timeout = timeout
        # Loopback when every rank shares this node; across nodes, the address rank 0's
        # name resolves to (as the other nodes resolve it).
        self._host = "127.0.0.1" if world.num_nodes == 1 else None
        self._hostname = world.hostname
        self._server: Optional[dist.TCPStore] = None
        self._where: Optional[Where] = None
        self._lock = threading.Lock()
        self._sends: List["MPI.Request"] = []
        self._stop = threading.Event()
        self._thread = None
        threaded = MPI.Query_thread() >= MPI.THREAD_SERIALIZED  # the MPI thread's
        self.secret = self.comm.bcast(secrets.token_hex(16) if self.rank == 0 else None)
        if not threaded:  # no thread may ask MPI later: open now, tell everyone now
            self._where = self.comm.bcast(self.where() if self.rank == 0 else None)
        elif self.rank == 0:
            self._thread = threading.Thread(target=self._run, name="hpcddp-store", daemon=True)
            self._thread.start()
        self._opened()

    # -- rank 0 --------------------------------------------------------------------------

    @property
    def serving(self) -> bool:
        """Whether rank 0 has opened the store (False on every other rank)."""
        return self._server is not None

    def where(self) -> Where:
        """Open the store if it is not open yet (rank 0 only); its address, or why not."""
        with self._lock:
            if self._where is None:
                self._where = self._open()
            return self._where

    def _open(self) -> Where:
        try:
            host = self._host or socket.gethostbyname(self._hostname)
            # A socket of hpcddp's, bound to that address alone: a TCPStore given a host
            # still listens on every interface.
            # The store owns the socket once it has it (and closes it when it goes).
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((host, 0))
                listener.listen(max(128, self.size))
                port = listener.getsockname()[1]
                self._server = dist.TCPStore(host, port, self.size, True,
                                             timeout=self.timeout, wait_for_workers=False,
                                             master_listen_fd=listener.fileno())
                listener.detach()
            return host, port
        except Exception as error:  # noqa: BLE001 - the store is optional: say why not
            return f"{type(error).__name__}: {error}"

    def _run(self) -> None:
        while not self._stop.wait(_TICK):
            try:
                asked = serial.call(_take_questions, self.comm, timeout=_LOCK_SECONDS)
                if asked:
                    where = self.where()
                    self._sends += [serial.call(MPI.Intracomm.isend, self.comm, where,
                                                dest=rank, tag=_WHERE) for rank in asked]
                self._sends = serial.call(_unfinished, self._sends, timeout=_LOCK_SECONDS)
            except serial.OwnerBusy:
                continue

    # -- every rank ----------------------------------------------------------------------

    def connect(self) -> dist.Store:
        """This rank's way into the store: the server itself on rank 0, else a client of
        it, whose address rank 0 gives (opening it now if this is the first question).

        Raises:
            RuntimeError: rank 0 could not serve a store; the message says why.
        """
        self._check_open()
        if self.rank == 0:
            where = self.where()
        elif self._where is not None:
            where = self._where
        else:
            with activity.waiting("asking rank 0 for torch.distributed's store"):
                self.comm.send(None, dest=0, tag=_ASK)
                where = self.comm.recv(source=0, tag=_WHERE)
        if isinstance(where, str):
            raise RuntimeError(
                f"hpcddp: torch.distributed's default store is needed (a group of a backend "
                f"other than hpcddp, e.g. new_group(backend='gloo'), swaps addresses through "
                f"it), but rank 0 could not serve one: {where}")
        if self.rank == 0:
            return self._server
        return dist.TCPStore(where[0], where[1], self.size, False, timeout=self.timeout)

    def _abandon(self) -> None:
        self._stop.set()
        self._server = None

    def _release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            serial.wait_all(self._sends)
        free_comm(self.comm)
        # The server itself goes with the last reference (a group of gloo may hold it).
        self._server = None


def _take_questions(comm) -> List[int]:
    """The ranks whose question has come; on the MPI thread."""
    asked = []
    status = MPI.Status()
    while True:
        probed = MPI.Intracomm.improbe(comm, MPI.ANY_SOURCE, _ASK, status)
        if probed is None:
            return asked
        probed.recv()
        asked.append(status.Get_source())


def _unfinished(requests) -> List["MPI.Request"]:
    return [request for request in requests if not MPI.Request.Test(request)]


class SharedStore(dist.Store):
    """A ``dist.Store`` that is rank 0's ``TCPStore`` under the job's secret prefix,
    joined on first use.

    Args:
        broker: the ``StoreBroker`` that finds it.
        timeout: how long an operation waits (a key another rank has not set yet).
    """

    def __init__(self, broker: StoreBroker, timeout: timedelta):
        super().__init__()
        self.broker = broker
        self._timeout = timeout
        self._client: Optional[dist.Store] = None
        self._lock = threading.Lock()

    def _store(self) -> dist.Store:
        with self._lock:
            if self._client is None:
                self._client = dist.PrefixStore(self.broker.secret, self.broker.connect())
            return self._client

    @property
    def connected(self) -> bool:
        """Whether this process has joined rank 0's store (or serves it)."""
        return self._client is not None

    # -- dist.Store ------------------------------------------------------------------

    def set(self, key, value):
        self._store().set(key, value)

    def get(self, key):
        return self._store().get(key)

    def add(self, key, value):
        return self._store().add(key, value)

    def compare_set(self, key, expected_value, desired_value):
        return self._store().compare_set(key, expected_value, desired_value)

    def delete_key(self, key):
        return self._store().delete_key(key)

    def num_keys(self):
        return self._store().num_keys()

    def check(self, keys):
        return self._store().check(keys)

    def wait(self, keys, timeout=None):
        if timeout is None:
            self._store().wait(keys)
        else:
            self._store().wait(keys, timeout)

    def clone(self):
        """The store for another thread (gloo asks for one per thread): this one, whose
        connection torch's TCPStore serializes. A new Python object would not do: torch
        keeps only its C++ part, and the calls it forwards to Python would find none."""
        return self

    def append(self, key, value):
        self._store().append(key, value)

    def multi_get(self, keys):
        return self._store().multi_get(keys)

    def multi_set(self, keys, values):
        self._store().multi_set(keys, values)

    def has_extended_api(self):
        return True  # TCPStore's: append, multi_get, multi_set

    def set_timeout(self, timeout):
        self._timeout = timeout
        if self._client is not None:
            self._client.set_timeout(timeout)


def shared_store(world, timeout: timedelta = timedelta(minutes=30)) -> SharedStore:
    """The default group's store: rank 0 opens it when a rank first needs it (torch's
    default timeout).

    .. warning:: Collective over ``world.comm``.
    """
    forget_shared_store()
    broker = StoreBroker(world, timeout)
    store = SharedStore(broker, timeout)
    # torch keeps the store's C++ part only: the Python object, which its calls are
    # forwarded to, must live as long as the group (until the next shared_store()).
    _LIVE[:] = [store]
    return store


_LIVE: List[SharedStore] = []


def forget_shared_store() -> None:
    """Let the store go (its server too, on rank 0), once the default group is gone.

    .. warning:: Collective: the broker's communicator is freed.
    """
    for store in _LIVE:
        store.broker.close()
    _LIVE.clear()
