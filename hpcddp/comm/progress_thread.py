"""One helper thread that drives pending operations to completion and reports each.

MPI moves data only while some thread is inside the library. A future must complete
without its owner calling ``wait()`` (torch's ``Future.then`` chains, comm hooks), so a
daemon thread ``test()``s the handles it watches and calls each one's callback the
moment it completes. It polls with a short, growing pause while handles are pending
and sleeps on a condition when none are. A ``Handle``'s tests are made by hpcddp's MPI
thread (``hpcddp.comm.serial``), so ``MPI_THREAD_SERIALIZED`` is enough
(``hpcddp.comm.thread_level``).
"""

import contextlib
import threading
from typing import Callable, List, Optional, Tuple

from hpcddp.comm import lifetime
from hpcddp.comm.handle import Handle
from hpcddp.comm.owner import OWNER

__all__ = ["Progress", "ProgressPump", "background", "on_progress_thread"]

Callback = Callable[[Optional[BaseException]], None]


class Progress:
    """A helper thread that tests handles and calls back when each completes.

    Example::

        background().watch(handle, lambda error: future.set_result(...))
    """

    _MIN_PAUSE, _MAX_PAUSE = 2e-5, 1e-3

    def __init__(self):
        self._cond = threading.Condition()
        self._watched: List[Tuple[Handle, Callback]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="hpcddp-progress", daemon=True)
        self._thread.start()
        lifetime.register(self)

    def watch(self, handle: Handle, callback: Callback) -> None:
        """Call ``callback(None)`` once ``handle`` completes, ``callback(error)`` if it fails."""
        with self._cond:
            self._watched.append((handle, callback))
            self._cond.notify()

    def _run(self):
        pause = self._MIN_PAUSE
        while True:
            with self._cond:
                while not self._watched and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                watched = list(self._watched)
            finished = []
            for item in watched:
                handle, callback = item
                try:
                    done, error = handle.test(), None
                except Exception as failure:  # noqa: BLE001 - handed to the callback
                    done, error = True, failure
                if done:
                    finished.append(item)
                    callback(error)
            with self._cond:
                for item in finished:
                    self._watched.remove(item)
                if not finished:
                    self._cond.wait(pause)
            pause = self._MIN_PAUSE if finished else min(pause * 2, self._MAX_PAUSE)

    def abandon(self) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread (pending handles stay pending). Runs before MPI is finalized."""
        lifetime.unregister(self)
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
        _background.pop("progress", None)


_background = {}
_create = threading.Lock()


def background() -> Progress:
    """The process's progress thread, started on first use."""
    with _create:
        if "progress" not in _background:
            _background["progress"] = Progress()
        return _background["progress"]


def on_progress_thread() -> bool:
    """Whether the caller runs on the progress thread (inside a completion callback)."""
    progress = _background.get("progress")
    return progress is not None and progress._thread is threading.current_thread()


class ProgressPump:
    """MPI moved during backward by hpcddp's MPI thread itself, between gradient hooks.

    While a pump runs, the MPI thread, whenever no thread waits for it, tests the pending
    operations of every transport and issues what is ready (``Owner.progressing``),
    sleeping 50 us to 0.5 ms between, so a bucket launched at one hook moves on an idle
    core (a GPU's backward) before the next hook. No call is handed over for it, and it
    is the thread that owns MPI that tests the requests.

    Example::

        pump = ProgressPump()
        ...                    # backward
        pump.stop()
    """

    def __init__(self):
        self._block = contextlib.ExitStack()
        self._block.enter_context(OWNER.progressing())

    def stop(self):
        self._block.close()
