"""The coordinator's table (``hpcddp.horovod.coordinator.Table``), fed requests as ranks
send them: a name leaves once every rank of its set has asked, in the order names became
ready, fused where they agree; a group leaves whole; a rank that joins stops holding up
its set's names. What Horovod's controller promises, checked here on the table alone."""

from hpcddp.horovod.common import Average, Sum
from hpcddp.horovod.coordinator import Table
from hpcddp.horovod.requests import ProcessSetInfo, Request

SETS = {0: ProcessSetInfo(0, [0, 1], 0, None), 1: ProcessSetInfo(1, [1, 2], None, None)}


def asked(rank, name, set_id=0, kind="allreduce", shape=(4,), op=Sum, group=None):
    request = Request(set_id, name, kind, "float32", shape, op=op, group=group)
    request.rank = rank
    return request


def taken(responses):
    return [(r.set_id, r.kind, r.names, r.error is not None) for r in responses]


def test_names_leave_once_every_rank_asked_in_the_order_they_became_ready():
    table = Table(SETS, fusion_bytes=1 << 20)
    first = table.take([asked(0, "a"), asked(0, "b"), asked(0, "c", op=Average)])
    assert first == [] and table
    # b completes before a: it leaves alone; then a and c, which cannot fuse (ops differ).
    assert taken(table.take([asked(1, "b")])) == [(0, "allreduce", ["b"], False)]
    assert taken(table.take([asked(1, "c", op=Average), asked(1, "a")])) == [
        (0, "allreduce", ["a"], False), (0, "allreduce", ["c"], False)]
    assert not table


def test_ready_names_fuse_up_to_the_threshold_and_many_waiting_names_stay_waiting():
    table = Table(SETS, fusion_bytes=3 * 16)  # three float32[4] tensors
    waiting = [asked(0, f"w{k}") for k in range(2000)]  # never asked by rank 1
    table.take(waiting)
    table.take([asked(0, f"x{k}") for k in range(4)])
    responses = table.take([asked(1, f"x{k}") for k in range(4)])
    assert taken(responses) == [(0, "allreduce", ["x0", "x1", "x2"], False),
                                (0, "allreduce", ["x3"], False)]
    assert len(table._pending) == 2000  # noqa: SLF001 - the names still waiting


def test_a_group_leaves_whole_once_its_last_name_is_ready():
    table = Table(SETS, fusion_bytes=16)  # below the group's bytes: a group still fuses
    group = ("g", 3)
    table.take([asked(0, n, group=group) for n in ("g0", "g1", "g2")])
    assert table.take([asked(1, "g1", group=group)]) == []
    assert table.take([asked(1, "g0", group=group), asked(0, "other"),
                       asked(1, "other")]) != []  # "other" leaves; the group does not
    assert taken(table.take([asked(1, "g2", group=group)])) == [
        (0, "allreduce", ["g0", "g1", "g2"], False)]
    assert not table


def test_a_joined_rank_no_longer_holds_up_its_sets_names_and_join_leaves_last():
    table = Table(SETS, fusion_bytes=1 << 20)
    assert table.take([asked(0, "a")]) == []
    responses = table.take([asked(1, "join.0", kind="join", shape=())])
    assert taken(responses) == [(0, "allreduce", ["a"], False)]
    assert responses[0].joined == [((4,), "float32", "cpu", Sum, 1.0, 1.0)]
    responses = table.take([asked(0, "b"), asked(0, "join.0", kind="join", shape=())])
    assert taken(responses) == [(0, "allreduce", ["b"], False), (0, "join", ["join.0"], False)]
    assert responses[1].sizes == [0]  # the last rank to join
    assert not table


def test_names_of_another_set_wait_for_that_sets_ranks_only():
    table = Table(SETS, fusion_bytes=1 << 20)
    assert table.take([asked(1, "s", set_id=1), asked(0, "s")]) == []
    assert taken(table.take([asked(2, "s", set_id=1)])) == [(1, "allreduce", ["s"], False)]


def test_ranks_that_disagree_get_an_error_response_naming_both():
    table = Table(SETS, fusion_bytes=1 << 20)
    table.take([asked(0, "a", shape=(4,))])
    [response] = table.take([asked(1, "a", shape=(5,))])
    assert "mismatched shape for allreduce 'a'" in response.error
    assert "[4] on rank 0; [5] on rank 1" in response.error, response.error
