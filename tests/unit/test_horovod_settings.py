"""The ``HOROVOD_*`` settings a Horovod job carries: those hpcddp honours pass in
silence, those it cannot honour are named with the reason, an unknown one is named."""

from hpcddp.horovod.settings import HONOURED, WITHOUT_EFFECT, describe, log_level, unheeded


def test_tuning_that_does_nothing_here_is_named_with_its_reason():
    lines = unheeded({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_FUSION_THRESHOLD": "64",
                      "HOROVOD_TIMELINE": "t.json", "HOROVOD_CYCLE_TIME": "0.5",
                      "HOROVOD_SPELLED_WRONG": "1", "HPCDDP_TIMEOUT": "60", "PATH": "/bin"})
    assert lines == [
        "HOROVOD_CYCLE_TIME=0.5 has no effect: the engine has no cycle: a name is decided "
        "as the last rank asks for it",
        "HOROVOD_HIERARCHICAL_ALLREDUCE=1 has no effect: hpcddp chooses the reduction "
        "(HPCDDP_REDUCE)",
        "HOROVOD_SPELLED_WRONG=1 has no effect: hpcddp.horovod does not know it"]


def test_a_misspelt_setting_is_named_with_the_one_meant():
    [line] = unheeded({"HOROVOD_STALL_CHECK_TIME_SECOND": "5"})
    assert line.endswith("did you mean HOROVOD_STALL_CHECK_TIME_SECONDS?"), line


def test_the_doctor_lists_every_horovod_setting_with_what_it_does():
    lines = describe({"HOROVOD_FUSION_THRESHOLD": "64", "HOROVOD_AUTOTUNE": "1",
                      "HOROVOD_LOG_LEVL": "debug", "OTHER": "x"})
    assert lines[0] == f"HOROVOD_FUSION_THRESHOLD=64: {HONOURED['HOROVOD_FUSION_THRESHOLD']}"
    assert lines[1].startswith("HOROVOD_AUTOTUNE=1 has no effect: ")
    assert lines[2].endswith("did you mean HOROVOD_LOG_LEVEL?"), lines
    assert len(lines) == 3


def test_log_level_sets_the_engine_logger_and_refuses_an_unknown_level():
    import logging

    import pytest

    logger = logging.getLogger("hpcddp.horovod")
    before = logger.level
    try:
        log_level({"HOROVOD_LOG_LEVEL": "TRACE"})
        assert logger.level == logging.DEBUG
        log_level({"HOROVOD_LOG_LEVEL": "fatal"})
        assert logger.level == logging.CRITICAL
        with pytest.raises(ValueError, match="HOROVOD_LOG_LEVEL='loud'"):
            log_level({"HOROVOD_LOG_LEVEL": "loud"})
    finally:
        logger.setLevel(before)


def test_every_setting_the_package_reads_is_in_the_table():
    import pathlib
    import re

    package = pathlib.Path(__file__).resolve().parents[2] / "hpcddp" / "horovod"
    read = set()
    for path in package.glob("*.py"):
        if path.name != "settings.py":
            # get_setting("HOROVOD_...") reads hpcddp's HPCDDP_HOROVOD_... instead
            read |= set(re.findall(r'(?<!get_setting\()"(HOROVOD_[A-Z_]+)"',
                                   path.read_text()))
    assert read and read <= set(HONOURED), read - set(HONOURED)
    assert not set(HONOURED) & set(WITHOUT_EFFECT)


def test_every_setting_horovodrun_writes_is_in_the_table():
    from hpcddp.commands.horovodrun import _SETTINGS

    written = {name for name, _ in _SETTINGS.values()}
    assert written <= set(HONOURED) | set(WITHOUT_EFFECT), written - set(HONOURED) - set(
        WITHOUT_EFFECT)
