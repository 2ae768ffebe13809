"""The hpcddp version, importable without importing anything else."""

__version__ = "0.1.0"
