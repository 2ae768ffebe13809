"""Fixtures for tests that launch whole MPI jobs as subprocesses."""

import pytest

from jobs_util import launch


@pytest.fixture
def run_job():
    """``launch`` as a fixture."""
    return launch
