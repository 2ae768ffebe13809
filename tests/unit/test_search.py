"""The autotuner's search, fed a known cost surface in place of measured steps.

The surface's minimum is computed here by brute force over the whole space, independently
of the search; the search must end on it within its step budget.
"""

import itertools
import math
import random

import pytest

from hpcddp.ddp.search import Search, Setting, Space

SPACE = Space.for_model(("mpi", "ring", "node"), (True, False), gradient_bytes=300 << 20)
START = Setting("mpi", True, 25.0, 1.0)


def every_setting(space):
    for reduction, solo, cap in itertools.product(space.reductions, space.solos, space.caps):
        for first in space.firsts(cap):
            yield Setting(reduction, solo, cap, first)


def surface(best_reduction, best_solo, best_cap, best_first):
    """A cost with one minimum: a price per reduction and solo choice, and a bowl in
    log2 of each cap around its best value."""
    def cost(s):
        price = 10.0 + (0 if s.reduction == best_reduction else 4.0) \
            + (0 if s.solo == best_solo else 1.5)
        first = min(s.first_mb, s.cap_mb)
        return price + 2.0 * math.log2(s.cap_mb / best_cap) ** 2 \
            + 1.0 * math.log2(first / best_first) ** 2
    return cost


def run(search, cost, noise=0.0, seed=0):
    rng = random.Random(seed)
    steps = 0
    while not search.done:
        search.observe(cost(search.current) * (1 + rng.uniform(-noise, noise)))
        steps += 1
        assert steps <= search.budget, "the search ran past its budget"
    return steps


@pytest.mark.parametrize("target", [("ring", False, 4.0, 0.25), ("node", True, 64.0, 2.0),
                                    ("mpi", True, 0.5, 0.5), ("ring", True, 256.0, 8.0)])
def test_finds_the_minimum_of_a_known_surface_within_budget(target):
    cost = surface(*target)
    truth = min(every_setting(SPACE), key=cost)
    search = Search(SPACE, START, samples=3, warmup=1, budget=80)
    steps = run(search, cost, noise=0.005)
    assert search.best.setting == truth, (search.best.setting, truth)
    assert steps <= 80
    assert search.current == truth  # it settles on what it found


def test_stops_early_when_the_start_is_best():
    search = Search(SPACE, START, samples=3, warmup=1, budget=200)
    steps = run(search, surface("mpi", True, 25.0, 1.0))
    assert search.best.setting == START
    # One pass: 2 reductions, 1 solo, 2 cap neighbours, 2 first neighbours, 4 steps each.
    assert steps == 4 * 7  # the best is the start: nothing to confirm


def test_plainly_worse_settings_are_dropped_after_one_step():
    search = Search(SPACE, START, samples=3, warmup=1, budget=200)
    cost = surface("mpi", True, 25.0, 1.0)
    run(search, lambda s: cost(s) * (3 if s.reduction == "ring" else 1))
    ring = [t for t in search.history if t.setting.reduction == "ring"]
    assert ring and all(t.abandoned and len(t.samples) == 1 for t in ring)


def test_budget_bounds_the_search_and_keeps_the_best_seen():
    search = Search(SPACE, START, samples=3, warmup=1, budget=10)
    cost = surface("ring", False, 2.0, 0.25)
    steps = run(search, cost)
    assert steps == 10
    assert search.best.cost == min(t.cost for t in search.history)
    assert search.current == search.best.setting


def test_noise_below_the_margin_does_not_move_the_choice():
    flat = lambda s: 20.0  # noqa: E731 - every setting costs the same
    search = Search(SPACE, START, samples=3, warmup=1, budget=200, margin=0.03)
    run(search, flat, noise=0.01, seed=3)
    assert search.best.setting == START


def test_space_for_a_small_model_and_snapping():
    space = Space.for_model(("mpi",), (True,), gradient_bytes=3 << 20)
    assert space.caps == (0.25, 0.5, 1.0, 2.0, 4.0)  # 4 MiB: one bucket
    assert space.snap(Setting("ring", False, 25.0, 1.0)) == Setting("mpi", True, 4.0, 1.0)
    assert space.firsts(1.0) == (0.125, 0.25, 0.5, 1.0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="samples=0"):
        Search(SPACE, START, samples=0)


def test_a_lucky_first_measure_does_not_move_the_choice():
    """Every setting is measured slightly slower than the start, except that the first
    measure of ring at cap 8 is a lucky one. The confirmation measures it again beside
    the start, pools the samples, and keeps the start."""
    seen = {}

    def cost(s):
        seen[s] = seen.get(s, 0) + 1
        if s == START._replace(reduction="ring") and seen[s] <= 4:
            return 15.0  # lucky: 25 % below the start
        return 20.0 if s == START else 21.0
    search = Search(SPACE, START, samples=3, warmup=1, budget=200)
    run(search, cost)
    assert search.best.setting == START
    assert [t.setting for t in search.history[-2:]] == [START, START._replace(reduction="ring")]
    unconfirmed = Search(SPACE, START, samples=3, warmup=1, budget=200, confirm=False)
    seen.clear()
    run(unconfirmed, cost)
    assert unconfirmed.best.setting.reduction == "ring"  # the control: fooled without it


def test_a_real_gain_survives_the_confirmation():
    search = Search(SPACE, START, samples=3, warmup=1, budget=200)
    run(search, lambda s: 15.0 if s.reduction == "ring" else 20.0)
    assert search.best.setting.reduction == "ring"
