"""The one getter for HPCDDP_* settings."""

import pytest

from hpcddp.env import (ConfigError, describe_settings, get_setting, signal_number,
                        unknown_settings)


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
                                          "ring, node, staged"):
        get_setting("REDUCE", {"HPCDDP_REDUCE": "tree"})


def test_seconds_are_read_and_a_bad_value_quoted():
    assert get_setting("TIMEOUT", {}) == 600.0
    assert get_setting("TIMEOUT", {"HPCDDP_TIMEOUT": "2.5"}) == 2.5
    for raw in ("soon", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=f"HPCDDP_TIMEOUT={raw!r} is not a number of seconds"):
            get_setting("TIMEOUT", {"HPCDDP_TIMEOUT": raw})


def test_a_misspelled_setting_is_named_with_the_nearest_real_one():
    said = unknown_settings({"HPCDDP_TIMOUT": "5", "HPCDDP_REDUCE": "ring",
                             "HPCDDP_TEST_GPU": "1", "HPCDDP_ZZZ": "1", "PATH": "/bin"})
    assert len(said) == 2
    assert "HPCDDP_TIMOUT is set but is no hpcddp setting" in said[0]
    assert "did you mean HPCDDP_TIMEOUT?" in said[0]
    assert "HPCDDP_ZZZ" in said[1] and "docs/settings.md" in said[1]


def test_preemption_signal_by_name_or_number_with_the_right_reason():
    import signal
    assert signal_number("10") == signal_number("USR1") == int(signal.SIGUSR1)
    assert signal_number("sigterm") == int(signal.SIGTERM)
    with pytest.raises(ConfigError, match="is SIGKILL, which no process can catch"):
        signal_number("9")
    with pytest.raises(ConfigError, match="there is no signal 999"):
        signal_number("999")
    with pytest.raises(ConfigError, match="names no signal"):
        signal_number("USR9")
