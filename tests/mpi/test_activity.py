"""The collective counts a rank reports, to the others when it leaves the job and in
stall reports, still hold a communicator freed since: a rank that destroyed a group after
its last collective and left had issued them, and a rank still finishing the last one
must not be told that it was never reached."""

import torch
import torch.distributed as dist

from hpcddp.comm import activity


def _counts():
    return activity.snapshot(stack=False)["channels"]


def test_a_destroyed_groups_count_is_still_reported(world):
    before = set(_counts())
    group = dist.new_group(list(range(world.size)))
    x = torch.ones(3)
    dist.all_reduce(x, group=group)
    dist.all_reduce(x, group=group)
    made = set(_counts()) - before
    assert len(made) == 1, made
    name = made.pop()
    count = _counts()[name][0]
    assert count >= 2 and x.tolist() == [world.size ** 2] * 3
    dist.destroy_process_group(group)
    assert _counts()[name][0] == count
