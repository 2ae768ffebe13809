"""The store of hpcddp's default group: shared between the processes, joined on first use.

hpcddp's ranks find each other through MPI, so its own groups never use a store. But
torch makes every group of another backend through the default group's store: a
``dist.new_group(backend="gloo")`` (a CPU group beside NCCL's, a ``monitored_barrier``,
a library's object collectives) has gloo's ranks swap their addresses there. A store of
each process's own would leave each rank waiting for the others' keys for ever.

So rank 0 serves a ``TCPStore`` on a port the kernel picks, its address goes to every
rank through MPI at ``init()``, and a process connects to it only when something first
uses the store. An MPI job that never makes a group of another backend opens no
connection at all, and hpcddp's start-up needs no TCP between the nodes.
"""

import socket
import threading
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

__all__ = ["SharedStore", "forget_shared_store", "shared_store"]


class SharedStore(dist.Store):
    """A ``dist.Store`` that is rank 0's ``TCPStore``, connected to on first use.

    Args:
        host, port: where rank 0 serves it.
        size: the number of processes.
        timeout: how long an operation waits (a key another rank has not set yet).
        server: rank 0's serving store itself (None elsewhere).
    """

    def __init__(self, host: str, port: int, size: int, timeout: timedelta,
                 server: Optional[dist.TCPStore] = None):
        super().__init__()
        self.host, self.port, self.size = host, port, size
        self._timeout = timeout
        self._client = server
        self._lock = threading.Lock()

    def _store(self) -> dist.TCPStore:
        with self._lock:
            if self._client is None:
                self._client = dist.TCPStore(self.host, self.port, self.size, False,
                                             timeout=self._timeout)
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
    """Serve the store on rank 0 and tell every rank where (torch's default timeout).

    .. warning:: Collective over ``world.comm``.
    """
    server, where = None, None
    if world.rank == 0:
        # Loopback when every rank shares this node; across nodes, the address rank 0's
        # name resolves to (as the other nodes resolve it).
        host = "127.0.0.1" if world.num_nodes == 1 else socket.gethostbyname(world.hostname)
        try:
            server = dist.TCPStore(host, 0, world.size, True, timeout=timeout,
                                   wait_for_workers=False)
            where = (host, server.port)
        except Exception as error:  # noqa: BLE001 - the store is optional: say why not
            where = f"{type(error).__name__}: {error}"
    where = world.comm.bcast(where, root=0)
    if isinstance(where, str):
        store = _Unserved(where, world.size, timeout)
    else:
        store = SharedStore(where[0], where[1], world.size, timeout, server)
    # torch keeps the store's C++ part only: the Python object, which its calls are
    # forwarded to, must live as long as the group (until the next shared_store()).
    _LIVE[:] = [store]
    return store


_LIVE = []


def forget_shared_store() -> None:
    """Let the store go (its server too, on rank 0), once the default group is gone."""
    _LIVE.clear()


class _Unserved(SharedStore):
    """What a process has where rank 0 could not serve a store: any use says why."""

    def __init__(self, why: str, size: int, timeout: timedelta):
        super().__init__("", 0, size, timeout)
        self._why = why

    def _store(self):
        raise RuntimeError(
            f"hpcddp: torch.distributed's default store is needed (a group of a backend "
            f"other than hpcddp, e.g. new_group(backend='gloo'), swaps addresses through "
            f"it), but rank 0 could not serve one at init(): {self._why}")
