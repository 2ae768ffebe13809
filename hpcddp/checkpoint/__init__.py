"""Rank-0 checkpoints: atomic, verified, broadcast on load, resuming bit for bit."""

from hpcddp.checkpoint.api import DamagedCheckpointsError, Resumed, load, load_model_state, save

__all__ = ["DamagedCheckpointsError", "Resumed", "load", "load_model_state", "save"]
