import pytest

import hpcddp


@pytest.fixture(scope="module")
def world():
    return hpcddp.init()
