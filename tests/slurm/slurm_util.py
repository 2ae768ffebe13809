"""Paths and log reading for the Slurm tests."""

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def read_log(path) -> str:
    """The job log with progress-bar redraws turned into lines.

    Two ranks' progress bars and prints share one file, and a block written by one can
    end inside a multi-byte bar character that the next block never completes, so
    undecodable bytes are replaced rather than failing the read.
    """
    if not os.path.exists(path):
        return ""
    return Path(path).read_bytes().decode("utf-8", "replace").replace("\r", "\n")


def final_result(text):
    """``((world_size, test_accuracy), parameters_sha256)`` of train_digits.py's last
    lines in a log; None for what is missing."""
    accuracy = re.search(r"^world_size=(\d+) test_accuracy=([\d.]+)$", text, re.M)
    digest = re.search(r"^parameters_sha256=(\w+)$", text, re.M)
    return accuracy and (int(accuracy.group(1)), float(accuracy.group(2))), \
        digest and digest.group(1)
