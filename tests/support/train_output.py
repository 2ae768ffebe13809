"""Reading what a training job printed: its log, its result line and its parameters'
digest (``parameters_sha256=...``, which examples/train_digits.py and the test scripts
print at their end)."""

import os
import re
from pathlib import Path

_DIGEST = re.compile(r"parameters_sha256=([0-9a-f]{16,64})")


def read_log(path) -> str:
    """The job log with progress-bar redraws turned into lines.

    Two ranks' progress bars and prints share one file, and a block written by one can
    end inside a multi-byte bar character that the next block never completes, so
    undecodable bytes are replaced rather than failing the read.
    """
    if not os.path.exists(path):
        return ""
    return Path(path).read_bytes().decode("utf-8", "replace").replace("\r", "\n")


def parameters_digest(text) -> str:
    """The one parameters digest in ``text``; fails, showing the text's end, when there is
    none or more than one (a second run's digest in the same output would hide a
    mismatch)."""
    found = _DIGEST.findall(text)
    assert len(found) == 1, f"{len(found)} parameters digests in:\n{text[-3000:]}"
    return found[0]


def final_result(text):
    """``((world_size, test_accuracy), parameters_sha256)`` of train_digits.py's last
    lines in a log; None for what is missing."""
    accuracy = re.search(r"^world_size=(\d+) test_accuracy=([\d.]+)$", text, re.M)
    digest = re.search(rf"^{_DIGEST.pattern}$", text, re.M)
    return accuracy and (int(accuracy.group(1)), float(accuracy.group(2))), \
        digest and digest.group(1)
