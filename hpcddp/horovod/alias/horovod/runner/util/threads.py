"""``horovod.runner.util.threads``: the thread helper Horovod's scripts and tests use."""

import threading

__all__ = ["in_thread"]


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Run ``target(*args)`` in a started thread and return the thread; with ``silent``,
    an exception in it is swallowed instead of printed."""
    def run():
        try:
            target(*args)
        except BaseException:  # noqa: BLE001 - a silent thread says nothing
            if not silent:
                raise
    thread = threading.Thread(target=run if silent else target, args=() if silent else args,
                              name=name, daemon=daemon)
    thread.start()
    return thread
