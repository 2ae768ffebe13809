"""The collective counts a rank reports, to the others when it leaves the job and in
stall reports, still hold a communicator freed since: a rank that destroyed a group after
its last collective and left had issued them, and a rank still finishing the last one
must not be told that it was never reached."""

import threading
import time

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


def _channel(world):
    return activity.channel_for(world.comm)


def test_a_blocking_collective_counts_once_with_no_wrapper_and_names_its_caller(world):
    channel = _channel(world)
    before = channel.count
    # A pickled bcast is two Ibcasts, a pickled allreduce an allgather of two parts,
    # Barrier an Ibarrier: one collective each, as on every other rank.
    assert world.comm.bcast(world.rank or "root's", root=0) == "root's"
    assert world.comm.allreduce(world.rank + 1) == world.size * (world.size + 1) // 2
    world.comm.Barrier()
    assert channel.count == before + 3
    calls = [call for _, call in list(channel.recent)[-3:]]
    here = f"{__name__}:{test_a_blocking_collective_counts_once_with_no_wrapper_and_names_its_caller.__name__}"
    assert calls == [f"{m} from {here}" for m in ("bcast", "allreduce", "Barrier")], calls
    with activity.named("the test's agreement"):
        world.comm.allgather(world.rank)
    assert channel.recent[-1] == (before + 4, "the test's agreement")
    # Every rank counted the same: the counts agree.
    assert len(set(world.comm.allgather(channel.count))) == 1


def test_a_rank_inside_a_blocking_collective_is_seen_waiting_in_it(world):
    """While rank 1 has not joined, rank 0 waits in the collective, and the watchdog's
    view of it (``current_waits``) says which collective of which channel: a thread of
    rank 0 looks, then lets rank 1 in by a message on a communicator of their own."""
    if world.size < 2:
        return
    side = world.comm.Dup()
    channel = _channel(world)
    seen = []

    def look():
        while not seen:
            seen.extend(w.as_dict() for w in activity.current_waits()
                        if w.thread == threading.main_thread().ident)
            time.sleep(0.001)
        side.send("come in", dest=1)

    if world.rank == 0:
        looker = threading.Thread(target=look)
        looker.start()
    elif world.rank == 1:
        assert side.recv(source=0) == "come in"
    expected = channel.count + 1
    with activity.named("the test's barrier"):
        world.comm.Barrier()
    if world.rank == 0:
        looker.join()
        assert len(seen) == 1, seen
        assert seen[0]["seq"] == expected and seen[0]["channel"] == channel.name
        assert seen[0]["what"] == f"the test's barrier (collective {expected} on {channel.name})"
    side.Free()
    assert not any(w.thread == threading.main_thread().ident
                   for w in activity.current_waits())


def test_a_freed_communicators_count_stays_without_a_forget(world):
    comm = world.comm.Dup()
    comm.allgather(0)
    comm.allgather(1)
    name = activity.channel_for(comm).name
    comm.Free()
    assert _counts()[name][0] == 2
