"""Fixtures for the MPI tests (run under ``mpiexec ... pytest -p hpcddp.testing``)."""

import pytest

import hpcddp
from gloo_group import make_gloo_group


@pytest.fixture(scope="module")
def world():
    return hpcddp.init()


@pytest.fixture(scope="module")
def gloo(world):
    """torch's gloo process group, built beside hpcddp's default group: the reference."""
    group, backend, store = make_gloo_group(world)
    yield group
    del group, backend, store
