"""Rank-0 checkpoints: atomic, verified, broadcast on load, resuming bit for bit."""

from hpcddp.checkpoint.api import Resumed, load, save

__all__ = ["Resumed", "load", "save"]
