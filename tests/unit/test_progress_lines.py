"""Progress in a batch log: whole lines, never a carriage return; tqdm's bar on a terminal."""

import io

from tqdm import tqdm

from hpcddp.data.progress import LineProgress, progress


class Log(io.StringIO):
    def isatty(self):
        return False


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_log_gets_one_line_at_the_end_of_a_fast_loop_and_no_carriage_return():
    log = Log()
    for _ in progress(range(1000), desc="epoch 0", file=log):
        pass
    text = log.getvalue()
    assert "\r" not in text
    assert text.count("\n") == 1 and "epoch 0: 100%" in text and "1000/1000" in text


def test_a_log_gets_a_line_per_interval_while_it_runs():
    log = Log()
    bar = progress(total=4, desc="pack", file=log, every=0)
    for _ in range(4):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert [line.split("|")[0].split()[-1] for line in lines] == ["25%", "50%", "75%", "100%"]


def test_nothing_is_written_for_an_empty_or_disabled_loop():
    log = Log()
    for _ in progress(range(0), file=log):
        pass
    for _ in progress(range(5), file=log, disable=True):
        pass
    assert log.getvalue() == ""


def test_a_terminal_gets_tqdms_own_bar():
    bar = progress(range(3), file=Terminal())
    assert type(bar) is tqdm and not isinstance(bar, LineProgress)
    bar.close()
