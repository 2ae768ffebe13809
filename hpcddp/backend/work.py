"""The torch ``Work`` of an hpcddp operation, and its ``Future``.

A collective returns once its MPI request is issued (or queued behind its CUDA
producer's event). ``wait()`` drives it to completion, and raises ``HandleTimeout``
naming the operation when a timeout runs out. ``get_future()`` returns a
``torch.futures.Future`` that hpcddp's progress thread (``hpcddp.comm.progress_thread``)
completes the moment MPI does, so ``.then()`` chains run without anyone calling
``wait()``; its tests are made by hpcddp's MPI thread (``hpcddp.comm.serial``), so
``MPI_THREAD_SERIALIZED`` is enough. Below it no helper thread may call MPI, and ``get_future()`` completes the
operation before it returns, with a warning.

Inside a DDP communication hook (``deferred_futures``) a future is completed neither by
the progress thread nor at once, but by ``settle`` at the end of backward, bucket by
bucket. A hook's ``.then()`` callbacks may start further collectives (PowerSGD starts two
per bucket), and MPI matches collectives by the order each rank issues them: callbacks
run whenever MPI happens to finish would issue them in a different order on each rank.
Settled in bucket order on the training thread, every rank issues the same sequence.
"""

import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

from hpcddp.comm.handle import HandleTimeout
from hpcddp.comm.progress_thread import background, on_progress_thread
from hpcddp.comm.thread_level import helper_threads_allowed
from hpcddp.transport import Transfer

__all__ = ["RecvWork", "StatusRequest", "Work", "deferred_futures", "settle"]

_local = threading.local()  # .collect: a list while a hook runs; .settling: a bool


@contextmanager
def deferred_futures(collect: list):
    """Inside, ``get_future()`` appends its work to ``collect`` and returns a future that
    only ``settle(collect)`` completes."""
    previous = getattr(_local, "collect", None)
    _local.collect = collect
    try:
        yield collect
    finally:
        _local.collect = previous


def settle(works: List["Work"]) -> None:
    """Complete ``works`` in order on this thread; their futures' callbacks run here, and
    any future asked for meanwhile is completed before it is returned."""
    previous = getattr(_local, "collect", None), getattr(_local, "settling", False)
    _local.collect, _local.settling = None, True
    try:
        for work in works:
            work.wait()
    finally:
        _local.collect, _local.settling = previous


def _seconds(timeout) -> Optional[float]:
    """torch's timeout (a timedelta; zero means none) in seconds, or None."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout or 0)
    return seconds if seconds > 0 else None


class Work(dist._Work):
    """The torch Work of an hpcddp collective: its transfers, and their future."""

    def __init__(self, transfers: List[Transfer], result: List[torch.Tensor],
                 group_timeout: Optional[float] = None):
        super().__init__()
        self._transfers = transfers
        self._result = result
        self._group_timeout = group_timeout  # seconds; the process group's, as gloo's
        self._future: Optional[torch.futures.Future] = None
        self._settle = threading.Lock()

    def wait(self, timeout=timedelta(0)):
        """Wait for every transfer, for at most ``timeout`` (zero: the process group's
        timeout, as gloo's; none where the group has none).

        Raises:
            HandleTimeout: ``timeout`` ran out; it names the operation.
            torch.distributed.DistBackendError: the group's timeout ran out (what gloo
                raises; a blocking collective such as ``dist.barrier`` raises it too).
        """
        seconds = _seconds(timeout)
        groups = seconds is None and bool(self._group_timeout)
        if groups:
            seconds = self._group_timeout
        whose = "the process group's timeout" if groups else "work.wait(timeout=...)"
        deadline = None if seconds is None else time.monotonic() + seconds
        for transfer in self._transfers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                transfer.wait(left)
            except HandleTimeout:
                message = (
                    f"hpcddp: {transfer.name} did not complete within {seconds:g} s "
                    f"({whose}): Timed out waiting for a rank taking part, which has not "
                    f"reached it. It stays pending (MPI cannot cancel a collective); wait "
                    f"again, or end the job")
                if groups:
                    raise dist.DistBackendError(message) from None
                raise HandleTimeout(message) from None
        self._resolve(None)
        return True

    def is_completed(self):
        return all(transfer.test() for transfer in self._transfers)

    def is_success(self):
        return self.is_completed()

    def result(self):
        self.wait()
        return self._result

    def _resolve(self, error: Optional[BaseException]) -> None:
        with self._settle:
            if self._future is None or self._future.done():
                return
            if error is not None:
                self._future.set_exception(error)
                return
            for transfer in self._transfers:
                transfer.synchronize()  # any stream may read a completed future's tensors
            self._future.set_result(self._result)

    def get_future(self):
        """A future of the result tensors, completed when MPI completes the operation."""
        with self._settle:
            if self._future is not None:
                return self._future
            self._future = torch.futures.Future()
        collect = getattr(_local, "collect", None)
        if collect is not None:
            collect.append(self)  # completed by settle(), in the order ranks agree on
        elif getattr(_local, "settling", False) or on_progress_thread():
            # A callback asks for another future (and usually waits on it at once):
            # complete it here, since nobody else will while this thread is busy.
            self.wait()
        elif all(transfer.done for transfer in self._transfers):
            self._resolve(None)
        elif helper_threads_allowed("completing futures in the background",
                                    "get_future() waits for the operation first"):
            left = [len(self._transfers)]

            def one_done(error):
                left[0] -= 1
                if error is not None or left[0] == 0:
                    self._resolve(error)
            for transfer in self._transfers:
                background().watch(transfer, one_done)
        else:
            self.wait()
        return self._future


class RecvWork(Work):
    """A receive from any source, which can tell where the message came from."""

    def _source_rank(self):
        self.wait()
        return self._transfers[0].result


class StatusRequest:
    """A request whose ``Test``/``Wait`` fill in a status (the sender of a receive)."""

    def __init__(self, request, status):
        self._request, self._status = request, status

    def Test(self):  # noqa: N802 - mpi4py's names
        return self._request.Test(self._status)

    def Wait(self):  # noqa: N802
        return self._request.Wait(self._status)
