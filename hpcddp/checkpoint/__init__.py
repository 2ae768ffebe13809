"""Rank-0 checkpoints: atomic, verified, broadcast on load, resuming bit for bit."""

from hpcddp.checkpoint.api import Resumed, load, load_model_state, save

__all__ = ["Resumed", "load", "load_model_state", "save"]
