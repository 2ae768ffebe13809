"""The straggler check's median of the other ranks, against statistics.median."""

import random
import statistics

from hpcddp.ddp.stragglers import _medians_of_the_others


def test_median_of_the_others_matches_the_median_of_each_list_without_the_value():
    rng = random.Random(0)
    for size in range(2, 40):
        values = [rng.choice([rng.random(), 0.5]) for _ in range(size)]  # ties too
        expected = [statistics.median(values[:i] + values[i + 1:]) for i in range(size)]
        assert _medians_of_the_others(values) == expected
