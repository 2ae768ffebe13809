"""``bucket_cap_mb="auto"``: settings change while training, and nothing else does.

References: single-process training on the global batch (the parameters after a run in
which the autotuner switched reductions and bucket layouts), the other ranks' choices
(gathered), and a saved checkpoint's choice taken on resume.
"""

import csv
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import hpcddp
import hpcddp.checkpoint as checkpoint
from ddp_models import global_batch, share

TOL = dict(rtol=1e-5, atol=1e-6)


class Deep(nn.Module):
    """Enough parameters (about 0.8 MiB) for several buckets under the smaller caps."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 192), nn.Tanh(),
                                  *[m for _ in range(4) for m in (nn.Linear(192, 192),
                                                                   nn.Tanh())])
        self.head = nn.Linear(192, 3)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.fixture
def tune_env(monkeypatch):
    monkeypatch.setenv("HPCDDP_AUTOTUNE_STEPS", "40")
    monkeypatch.setenv("HPCDDP_SOLO_BUCKET_KB", "64")  # the 144 KiB layers may go alone


def _step(ddp, opt, step, world, reference=None, ref_opt=None):
    x, y = global_batch(step, world.size, "dense")
    if reference is not None:
        ref_opt.zero_grad()
        F.mse_loss(reference(x), y).backward()
        ref_opt.step()
    opt.zero_grad()
    F.mse_loss(ddp(share(x, world.rank)), share(y, world.rank)).backward()
    opt.step()


def _layout(ddp):
    reducer = ddp.reducer
    return (reducer.transport.reduction.name, tuple(b.layout.params for b in reducer.buckets))


@pytest.mark.parametrize("static_graph", [False, True])
def test_parameters_equal_single_process_training_while_settings_change(world, tune_env,
                                                                       static_graph):
    torch.manual_seed(0)
    reference = Deep()
    ddp = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="auto", static_graph=static_graph)
    ddp.module.load_state_dict(reference.state_dict())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    layouts = set()
    for step in range(48):
        _step(ddp, opt, step, world, reference, ref_opt)
        layouts.add(_layout(ddp))
    assert ddp.tuner.settled
    assert len(layouts) >= 3, f"the settings never changed: {layouts}"
    assert {name for name, _ in layouts} >= {"mpi", "ring"}
    for ours, theirs in zip(ddp.module.parameters(), reference.parameters()):
        torch.testing.assert_close(ours.detach(), theirs.detach(), **TOL)
    ddp.close()


def test_every_rank_settles_on_the_same_setting_even_when_they_measure_differently(
        world, tune_env):
    """Each rank is told a cost surface of its own (a stand-in for its timings): rank r
    finds cap 2**-r MiB cheapest. Agreed on the slowest rank's cost, every rank follows
    the same path and settles on the same setting at the same step."""
    torch.manual_seed(0)
    ddp = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="auto")
    tuner = ddp.tuner
    favourite = 2.0 ** -world.rank

    def stand_in(began):
        s = tuner._applied or tuner.search.current
        tuner._cost = 0.01 * (1 + abs(s.cap_mb - favourite) + (s.reduction != "ring"))
    ddp.reducer.timer = stand_in
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    settled_at = None
    for step in range(48):
        _step(ddp, opt, step, world)
        if settled_at is None and tuner.settled:
            settled_at = step
    seen = world.comm.allgather((tuner.search.best_setting, settled_at,
                                 [t.setting for t in tuner.search.history], _layout(ddp)))
    assert all(s == seen[0] for s in seen), seen
    assert tuner.search.best_setting.reduction == "ring"
    ddp.close()


def test_a_resume_takes_the_saved_choice_and_searches_no_more(world, tune_env, folder,
                                                             monkeypatch):
    torch.manual_seed(0)
    ddp = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="auto")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(48):
        _step(ddp, opt, step, world)
    assert ddp.tuner.settled
    chosen, layout = ddp.tuner.search.best_setting, _layout(ddp)
    checkpoint.save(folder, ddp, opt, step=48)
    ddp.close()

    again = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="auto")
    opt = torch.optim.SGD(again.parameters(), lr=0.05)
    assert checkpoint.load(folder, again, opt) is not None
    assert again.tuner.settled and again.tuner.search.steps == 0
    assert again.reducer.timer is None  # no more measuring
    assert again.tuner.search.current == chosen
    assert _layout(again) == layout
    assert again.bucket_bytes_cap == int(chosen.cap_mb * (1 << 20))
    _step(again, opt, 48, world)  # trains on with no search collective
    assert again.tuner.search.steps == 0
    again.close()

    # Another network or world: the saved choice is not taken, and the search runs.
    other = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="auto")
    saved = dict(ddp.autotune_state() or again.autotune_state())
    saved["fingerprint"] = dict(saved["fingerprint"], nodes=saved["fingerprint"]["nodes"] + 1)
    with pytest.warns(UserWarning, match="chosen on another nodes; searching again") \
            if world.rank == 0 else _nothing():
        assert not other.load_autotune_state(saved)
    assert not other.tuner.settled
    other.close()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_what_was_tried_is_logged_on_rank_0(world, tune_env, folder, monkeypatch, capfd):
    log = world.comm.bcast(folder + ".csv" if world.rank == 0 else None)
    earlier = None
    if world.rank == 0:  # an earlier run's search: kept, the new one after it
        from hpcddp.ddp.autotune import _LOG_FIELDS
        earlier = dict.fromkeys(_LOG_FIELDS, "earlier")
        with open(log, "w", newline="") as f:
            writer = csv.DictWriter(f, _LOG_FIELDS)
            writer.writeheader()
            writer.writerow(earlier)
    monkeypatch.setenv("HPCDDP_AUTOTUNE_LOG", log)
    monkeypatch.setenv("HPCDDP_AUTOTUNE", "1")  # on without touching the code
    ddp = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb=0.5)
    assert ddp.tuner is not None
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(48):
        _step(ddp, opt, step, world)
    assert ddp.tuner.settled
    err = capfd.readouterr().err
    world.comm.Barrier()
    if world.rank == 0:
        assert "hpcddp autotune: chose reduction=" in err
        with open(log) as f:
            rows = list(csv.DictReader(f))
        assert rows.pop(0) == earlier
        tried = [r for r in rows if r["chosen"] == "0"]
        assert len(tried) == len(ddp.tuner.search.history) >= 3
        assert tried[0]["bucket_cap_mb"] == "0.5"  # the start: the cap given
        chosen = rows[-1]
        best = ddp.tuner.search.best_setting
        assert (chosen["trial"], chosen["reduction"], float(chosen["bucket_cap_mb"])) == \
            ("chosen", best.reduction, best.cap_mb)
    else:
        assert "hpcddp autotune" not in err and not os.path.exists(log + ".1")
    ddp.close()


def test_a_comm_hook_with_bucket_state_ends_the_search(world, tune_env):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp = hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="auto")
    ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    assert ddp.tuner.settled and ddp.tuner.search.steps == 0
    ddp.close()


def test_a_bad_cap_is_refused_on_every_rank(world):
    with pytest.raises(ValueError, match="bucket_cap_mb='fast'.*'auto'"):
        hpcddp.DistributedDataParallel(Deep(), bucket_cap_mb="fast")
