"""Rank-0 checkpoints: atomic, verified, broadcast on load, resuming bit for bit."""

import hpcddp.runtime  # noqa: F401 - first: MPI starts there, as hpcddp starts it
from hpcddp.checkpoint.api import DamagedCheckpointsError, Resumed, load, load_model_state, save

__all__ = ["DamagedCheckpointsError", "Resumed", "load", "load_model_state", "save"]
