"""``Prefetcher``: a thread that reads ahead of the training loop.

The loader's reads (a batch's rows, or several batches' at once) run in one helper thread
a few results ahead; the consumer takes them in order. An error in the thread is handed
to the consumer and raised there. ``stop()`` ends the thread, also with an iteration left
unfinished.
"""

import queue
import sys
import threading

__all__ = ["Prefetcher"]


class Prefetcher:
    """Runs ``load`` over ``items`` in a thread, ``depth`` results ahead of the consumer."""

    def __init__(self, load, items, depth):
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(load, items), daemon=True,
                                        name="hpcddp-prefetch")
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, load, items):
        try:
            for item in items:
                if not self._put(("ok", load(item))):
                    return
            self._put(("end", None))
        except BaseException as error:  # handed to the consumer, raised there
            self._put(("error", error))

    def __iter__(self):
        while True:
            kind, value = self._queue.get()
            if kind == "end":
                return
            if kind == "error":
                raise value
            yield value

    def stop(self):
        self._stop.set()
        # While the interpreter shuts down (an abandoned iteration collected late) a
        # daemon thread may already be frozen, and joining it would wait forever.
        if not sys.is_finalizing():
            self._thread.join()
