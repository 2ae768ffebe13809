"""Launcher facts and ``HPCDDP_*`` settings, read from the environment (standard library only)."""

from hpcddp.env.config import (
    ConfigError, describe_settings, get_setting, signal_number, unknown_settings)
from hpcddp.env.jobvars import clean_environment
from hpcddp.env.launchers import (
    LAUNCHERS,
    Launcher,
    SingletonLaunchError,
    check_not_singleton,
    detect_launcher,
)

__all__ = [
    "ConfigError",
    "LAUNCHERS",
    "Launcher",
    "SingletonLaunchError",
    "check_not_singleton",
    "clean_environment",
    "describe_settings",
    "detect_launcher",
    "get_setting",
    "signal_number",
    "unknown_settings",
]
