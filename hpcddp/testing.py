"""A pytest plugin for tests that run on every rank of an MPI job.

Use it as ``mpiexec -n 2 python -m pytest -p hpcddp.testing tests/mpi``. It:

- initializes hpcddp before collection, so tests can take ``hpcddp.get_world()``;
- prints the MPI library, rank and size in the header, and reports on rank 0 only;
- ends the whole job when a test fails on any rank. pytest catches a failing assert,
  so the abort-on-exception hook never sees it, and the other ranks would wait forever
  in the test's next collective. The failing rank prints its report, then aborts;
- gives each rank ``HPCDDP_TEST_EXIT_S`` seconds (300) from the end of the session to
  exit; a rank still there prints every thread's stack and exits with status 1 (or, in
  ``MPI_Finalize``, after the interpreter, is ended by SIGALRM 30 s later), so a hang
  while shutting down fails the job with a place to look instead of a timeout.
"""

import faulthandler
import os
import signal

import pytest

__all__ = []

_state = {}


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    import hpcddp

    world = _state["world"] = hpcddp.init()
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        _hand_over_capture_at_abort(capture, world.rank)
    if world.rank != 0:
        # One report for the job: rank 0's. Failures elsewhere are printed before abort.
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def _hand_over_capture_at_abort(capture, rank):
    """An abort from inside a test (a helper thread's uncaught exception) would end the
    process with what it printed still in pytest's capture: hand that to the real
    stdout and stderr first, so the job's output says why it ended."""
    import sys

    from hpcddp.faults.abort import BEFORE_ABORT

    def release():
        if not capture.is_globally_capturing():
            return
        out, err = capture.read_global_capture()
        capture.suspend_global_capture(in_=True)
        for text, stream in ((out, sys.stdout), (err, sys.stderr)):
            if text:
                stream.write("".join(f"[rank {rank}] {line}"
                                     for line in text.splitlines(True)))
                stream.flush()
    BEFORE_ABORT.append(release)
    _state["release"] = release


def pytest_report_header(config):
    from hpcddp.startup.mpi_library import library_version_line

    world = _state["world"]
    library = " ".join(library_version_line().split())
    return [f"MPI: {library}, rank {world.rank} of {world.size} "
            f"({world.num_nodes} node(s)), torch threads per rank: {world.num_threads}"]


def _abort(what, text):
    from hpcddp.faults.abort import abort_job
    from hpcddp.runtime import get_world

    # The world of now: a test may have shut hpcddp down and initialized it again.
    abort_job(get_world().comm, f"{what} FAILED; aborting all ranks so none waits forever",
              detail=text + "\n", facts={"kind": "test", "test": what})


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _abort(f"{item.nodeid} ({report.when})", report.longreprtext)


def pytest_unconfigure(config):
    from hpcddp.faults.abort import BEFORE_ABORT

    if _state.get("release") in BEFORE_ABORT:
        BEFORE_ABORT.remove(_state.pop("release"))
    if "world" in _state:
        seconds = float(os.environ.get("HPCDDP_TEST_EXIT_S", "300"))
        faulthandler.dump_traceback_later(seconds, exit=True)
        # faulthandler stops while the interpreter finalizes; MPI_Finalize comes after.
        signal.alarm(int(seconds) + 30)  # SIGALRM's default action ends the process


def pytest_collectreport(report):
    if report.failed:
        _abort(f"collecting {report.nodeid}", report.longreprtext)
