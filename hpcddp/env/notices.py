"""Warnings that point at the user's line, once per job.

A warning raised inside hpcddp names hpcddp's own file unless its ``stacklevel`` happens
to match the call depth, which differs between callers. ``warn_user`` walks out of the
package instead, so the warning names the line of the training script that led to it
(``checkpoint.load(...)``, ``loader.load_state_dict(...)``). Collective code reaches the
same decision on every rank; ``rank`` lets it warn on rank 0 alone, not once per rank.
Standard library only: any floor may use it.
"""

import os
import sys
import warnings

__all__ = ["warn_user"]

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # hpcddp/


def warn_user(message: str, category=UserWarning, rank: int = 0) -> None:
    """Warn with ``message`` at the first caller outside hpcddp; only where ``rank`` is 0."""
    if rank != 0:
        return
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
