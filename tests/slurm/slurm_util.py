"""Paths and log reading for the Slurm tests."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def read_log(path) -> str:
    """The job log with progress-bar redraws turned into lines."""
    return Path(path).read_text().replace("\r", "\n") if os.path.exists(path) else ""
