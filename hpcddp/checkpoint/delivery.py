"""How a checkpoint's bytes reach every rank: once per node, shared within the node.

Rank 0 has the file open. One rank per node (its lowest) receives the bytes by a
broadcast among those ranks into anonymous memory (a ``memfd``); every other rank of a
node maps that rank's file through ``/proc/<pid>/fd/<fd>``, so a node holds one copy in
memory and moves it across the network once, and on rank 0's node nobody copies it at
all: its ranks map the page cache rank 0 reads. ``torch.load(mmap=True)`` then takes the
tensors straight from the mapping. Where a rank cannot open another's descriptor (no
``/proc``, a ``hidepid`` mount), its node's lowest rank broadcasts the bytes to it too.
"""

import ctypes
import io
import mmap
import os
from typing import List, Optional, Tuple

import numpy as np
import torch
from mpi4py import MPI

__all__ = ["Delivered", "FileMappings", "deliver"]

_HAS_MEMFD = hasattr(os, "memfd_create")


class _InMemoryFile:
    """Memory that a broadcast lands in and ``torch.load(mmap=True)`` reads in place:
    an anonymous memory file (``memfd``), or elsewhere a plain buffer."""

    def __init__(self, size: int):
        self.fd = os.memfd_create("hpcddp-checkpoint") if _HAS_MEMFD else None
        if self.fd is not None:
            os.ftruncate(self.fd, size)
            self._map = mmap.mmap(self.fd, size)
            self.array = np.frombuffer(self._map, np.uint8)
        else:
            self.array = np.empty(size, np.uint8)

    def close(self):
        self.array = None  # the map cannot close under a live view
        if self.fd is not None:
            self._map.close()
            os.close(self.fd)
            self.fd = None


class Delivered:
    """The checkpoint's bytes on this rank: ``load(device)`` deserializes them, and
    ``close()`` lets them go once every rank of the node has loaded (after the agreement
    that follows, which is collective)."""

    def __init__(self, path: Optional[str], memory: Optional[_InMemoryFile] = None):
        self.path, self.memory = path, memory

    def load(self, device):
        if self.path is not None:
            return torch.load(self.path, map_location=device, weights_only=True, mmap=True)
        return torch.load(io.BytesIO(self.memory.array), map_location=device,
                          weights_only=True)

    def close(self):
        if self.memory is not None:
            self.memory.close()


def _populated_map(fd, size) -> mmap.mmap:
    """A private, writable map of ``fd`` with its pages mapped at once: MPI sending from
    a map that faults page by page takes a page fault per page.

    Writable because MPI_Bcast's buffer is INOUT at the root too: MPICH's broadcast of a
    large message to 8 ranks or more (scatter, then an allgather) writes the root's own
    pieces back into it, and a read-only map ended rank 0 with SIGSEGV. Private, so such
    writes (of the same bytes) copy the page and never reach the checkpoint's file."""
    flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def _memory_copy(size: int):
    memory = _InMemoryFile(size)
    path = f"/proc/self/fd/{memory.fd}" if memory.fd is not None else None
    return Delivered(path, memory), memory


def _opened_by_peer(pid: int, fd: int) -> Optional[str]:
    """A path to another process's descriptor that this process can open, or None."""
    path = f"/proc/{pid}/fd/{fd}"
    try:
        os.close(os.open(path, os.O_RDONLY))
    except OSError:
        return None
    return path


def deliver(comm, opened, state_path: str, size: int, node=None) -> Delivered:
    """Bring the ``size`` bytes rank 0 has open (``opened``: its ``fd`` and ``map``; its
    path ``state_path``) to every rank of ``comm``.

    Args:
        node: the ranks that share memory with this one, ordered by rank in ``comm``
            (default: ``Split_type(COMM_TYPE_SHARED)``; made and freed here).

    .. warning:: Collective over ``comm``.
    """
    own_node = node is None
    if own_node:
        node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    # One node (the common case of a single-node job): no broadcast between nodes.
    lowest = MPI.COMM_NULL if node.size == comm.size else \
        comm.Split(0 if node.rank == 0 else MPI.UNDEFINED, key=comm.rank)
    try:
        here, bytes_here, shared = None, None, None
        if comm.rank == 0:
            here, shared = Delivered(state_path), (os.getpid(), opened.fd)
            if lowest != MPI.COMM_NULL and lowest.size > 1:
                bytes_here = np.frombuffer(_populated_map(opened.fd, size), np.uint8)
                lowest.Bcast(bytes_here, root=0)
        elif node.rank == 0:
            here, memory = _memory_copy(size)
            lowest.Bcast(memory.array, root=0)
            bytes_here = memory.array
            shared = (os.getpid(), memory.fd) if memory.fd is not None else None
        shared = node.bcast(shared, root=0)
        if node.rank != 0 and shared is not None:
            path = _opened_by_peer(*shared)
            here = Delivered(path) if path is not None else None
        if node.allreduce(here is None, op=MPI.LOR):
            # Ranks that cannot map the node's copy are sent one of their own.
            lacking = node.Split(0 if node.rank == 0 or here is None else MPI.UNDEFINED)
            if lacking != MPI.COMM_NULL:
                if here is None:
                    here, memory = _memory_copy(size)
                    bytes_here = memory.array
                elif bytes_here is None:  # rank 0, which sent nothing yet
                    bytes_here = np.frombuffer(_populated_map(opened.fd, size), np.uint8)
                lacking.Bcast(bytes_here, root=0)
                lacking.Free()
        return here
    finally:
        if own_node:
            node.Free()
        if lowest != MPI.COMM_NULL:
            lowest.Free()


class FileMappings:
    """This process's file-backed mappings (``/proc/self/maps``, read once), to give back
    the pages of tensors ``torch.load(mmap=True)`` took from a map, once they are copied.

    A loaded checkpoint is touched twice: the model is copied into its parameters and the
    rest into private memory. Each page read stays in the process's resident memory for
    as long as the map lives; given back as soon as its tensor is copied, the load's peak
    is the copies plus one tensor, not the copies plus the whole file. Giving back a page
    of a file map that was never written loses nothing: a later read maps it again.
    """

    def __init__(self):
        self._ranges: List[Tuple[int, int]] = []
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6 and fields[5].startswith("/"):
                        start, end = fields[0].split("-")
                        self._ranges.append((int(start, 16), int(end, 16)))
        except OSError:
            pass  # no /proc: nothing is given back
        self._madvise = ctypes.CDLL(None, use_errno=True).madvise if self._ranges else None

    def let_go(self, obj) -> None:
        """Give back the whole pages of every CPU tensor in ``obj`` (dicts, lists and
        tuples followed) that lie in a file map; other tensors are left alone."""
        if isinstance(obj, torch.Tensor):
            self._let_go(obj)
        elif isinstance(obj, dict):
            for value in obj.values():
                self.let_go(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                self.let_go(value)

    def _let_go(self, tensor: torch.Tensor) -> None:
        if tensor.device.type != "cpu" or self._madvise is None:
            return
        storage = tensor.untyped_storage()
        start, size = storage.data_ptr(), storage.nbytes()
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        last = (start + size) // mmap.PAGESIZE * mmap.PAGESIZE
        if last <= first or not any(a <= first and last <= b for a, b in self._ranges):
            return
        self._madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first),
                      mmap.MADV_DONTNEED)
