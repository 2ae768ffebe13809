"""Paths and log reading for the Slurm tests."""

import os
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
