"""A pytest plugin for Horovod's own suite, ``test/parallel/test_torch.py`` of a Horovod
checkout, run on ``hpcddp.horovod`` (``make test-horovod-suite HOROVOD_SRC=...``).

The suite runs unchanged but for one thing, said in pytest's summary: its every-optimizer
tests (``test_broadcast_state``, ``test_broadcast_state_options``,
``test_force_allreduce``) build each ``torch.optim`` class on a model with biases, and
``torch.optim.Muon`` (torch 2.9 and later, newer than the suite) refuses parameters that
are not 2-D. The suite picks its classes by ``__module__``; Muon's is moved out of
``torch.optim`` for the session. ``tests/horovod/test_horovod_optimizer.py`` broadcasts
Muon's state on a 2-D model.
"""

import torch

_HIDDEN = []


def pytest_configure(config):
    muon = getattr(torch.optim, "Muon", None)
    if muon is not None and muon.__module__.startswith("torch.optim"):
        _HIDDEN.append((muon, muon.__module__))
        muon.__module__ = "hpcddp_peer_suite.left_out"


def pytest_unconfigure(config):
    for cls, module in _HIDDEN:
        cls.__module__ = module


def pytest_terminal_summary(terminalreporter):
    if _HIDDEN:
        terminalreporter.write_line(
            "hpcddp: torch.optim.Muon (2-D parameters only, newer than this suite) is left "
            "out of the suite's every-optimizer tests")
