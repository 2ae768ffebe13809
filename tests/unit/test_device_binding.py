"""Which GPU each local rank takes, from what every local rank sees."""

import pytest

from hpcddp.runtime.world import device_index


@pytest.mark.parametrize("visible", [[None] * 4, ["0,1,2,3"] * 4])
def test_shared_gpus_go_one_per_local_rank(visible):
    assert [device_index(r, visible, 4) for r in range(4)] == [0, 1, 2, 3]


def test_more_gpus_than_ranks_each_rank_uses_only_its_own():
    assert [device_index(r, [None] * 2, 8) for r in range(2)] == [0, 1]


def test_more_ranks_than_gpus_share_them_round_robin():
    assert [device_index(r, [None] * 3, 2) for r in range(3)] == [0, 1, 0]


def test_gpus_given_per_task_by_slurm_are_respected():
    # srun --gpus-per-task=1: each task sees only its own GPU, as index 0.
    assert [device_index(r, ["0", "1", "2", "3"], 1) for r in range(4)] == [0, 0, 0, 0]
    # --gpus-per-task=2: each task takes the first of its two, not local_rank % 2.
    visible = ["0,1", "2,3", "4,5", "6,7"]
    assert [device_index(r, visible, 2) for r in range(4)] == [0, 0, 0, 0]


def test_ranks_grouped_by_what_they_see():
    visible = ["0,1", "0,1", "2,3", "2,3"]  # two ranks per GPU pair
    assert [device_index(r, visible, 2) for r in range(4)] == [0, 1, 0, 1]
