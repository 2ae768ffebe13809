"""The one getter for HPCDDP_* settings."""

import pytest

from hpcddp.env import ConfigError, describe_settings, get_setting


@pytest.mark.parametrize("raw, value", [
    ("1", True), ("true", True), ("YES", True), (" on ", True),
    ("0", False), ("False", False), ("no", False), ("off", False),
])
def test_booleans(raw, value):
    assert get_setting("ABORT_ON_ERROR", {"HPCDDP_ABORT_ON_ERROR": raw}) is value


def test_defaults_when_unset_or_empty():
    assert get_setting("ABORT_ON_ERROR", {}) is True
    assert get_setting("ABORT_ON_ERROR", {"HPCDDP_ABORT_ON_ERROR": ""}) is True
    assert get_setting("CUDA_AWARE", {}) is None
    assert get_setting("NUM_THREADS", {}) == 0


def test_tristate_accepts_auto():
    assert get_setting("CUDA_AWARE", {"HPCDDP_CUDA_AWARE": "auto"}) is None
    assert get_setting("CUDA_AWARE", {"HPCDDP_CUDA_AWARE": "1"}) is True


@pytest.mark.parametrize("name, raw", [
    ("ABORT_ON_ERROR", "maybe"), ("CUDA_AWARE", "2"), ("NUM_THREADS", "four"),
    ("NUM_THREADS", "-3"),
])
def test_bad_values_are_quoted_in_the_error(name, raw):
    with pytest.raises(ConfigError) as info:
        get_setting(name, {f"HPCDDP_{name}": raw})
    assert f"HPCDDP_{name}={raw!r}" in str(info.value)


def test_every_setting_is_described():
    names = [row[0] for row in describe_settings()]
    assert "HPCDDP_CUDA_AWARE" in names and all(row[3] for row in describe_settings())


def test_a_choice_is_read_case_insensitively_and_a_wrong_one_quoted():
    assert get_setting("REDUCE", {}) == "auto"
    assert get_setting("REDUCE", {"HPCDDP_REDUCE": " Ring "}) == "ring"
    with pytest.raises(ConfigError, match="HPCDDP_REDUCE='tree' is not one of auto, mpi, "
                                          "ring, staged"):
        get_setting("REDUCE", {"HPCDDP_REDUCE": "tree"})
