"""Progress bars that suit both a terminal and a batch log.

On a terminal, tqdm redraws one line in place. In a Slurm log (stderr not a terminal)
every redraw is another ``\\r``-joined stretch of one ever longer line. ``progress()``
gives tqdm's bar on a terminal and, anywhere else, tqdm's same meter written as a line
of its own every ``every`` seconds, and once at the end.
"""

import sys

from tqdm import tqdm

__all__ = ["LineProgress", "progress"]


class LineProgress(tqdm):
    """tqdm that writes whole lines: at most one per ``every`` seconds, and the last.

    Nothing is written before the first item, nor cleared at the end.
    """

    def __init__(self, *args, every: float = 30.0, **kwargs):
        self._closing, self._written = False, None
        kwargs.update(mininterval=every, leave=False, ascii=True, dynamic_ncols=False)
        super().__init__(*args, **kwargs)

    def display(self, msg=None, pos=None):
        if self._closing or msg == "" or self.n == 0:
            return False  # False: tqdm's close() writes no "\r" after it
        self.fp.write(str(self) + "\n")
        self.fp.flush()
        self._written = self.n
        return True

    def close(self):
        if not self.disable and self.n and self._written != self.n:
            self.display()
        self._closing = True
        super().close()


def progress(iterable=None, *, every: float = 30.0, file=None, **kwargs):
    """A tqdm bar on a terminal, else a :class:`LineProgress` writing to ``file``.

    Args:
        iterable: what to iterate over, as for tqdm.
        every: in a log, the least seconds between two lines.
        file: where the bar goes; ``sys.stderr`` by default, as tqdm's.
        kwargs: tqdm's (``desc``, ``total``, ``unit``, ``disable``, ...).
    """
    file = sys.stderr if file is None else file
    isatty = getattr(file, "isatty", None)
    if isatty is not None and isatty():
        return tqdm(iterable, file=file, **kwargs)
    return LineProgress(iterable, every=every, file=file, **kwargs)
