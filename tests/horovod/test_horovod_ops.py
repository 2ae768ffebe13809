"""``hpcddp.horovod``'s operations, held to what Horovod's own ``test_torch.py`` requires.

Every rank can make every rank's input from its seed, so each result is checked against
the closed form computed here from all the inputs (the sum, the concatenation, the
root's tensor), not against the engine. The engine's contract is checked as Horovod's
tests check it: names matched in any order, a duplicate name in flight refused at once,
a mismatch raised on every rank at ``synchronize``, a handle that completes while the
caller computes.
"""

import itertools
import time

import pytest
import torch

import hpcddp.horovod as hvd

DTYPES = [torch.int32, torch.int64, torch.float32, torch.float64, torch.bfloat16]


@pytest.fixture(scope="module", autouse=True)
def horovod(world):
    hvd.init()
    yield
    hvd.shutdown()


def _input(rank, shape, dtype, salt=0):
    g = torch.Generator().manual_seed(7919 * rank + 31 * salt + 1)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(-20, 20, shape, generator=g).to(dtype)


def _all(shape, dtype, salt=0):
    return [_input(r, shape, dtype, salt) for r in range(hvd.size())]


def _close(a, b, dtype):
    if dtype == torch.bfloat16:
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)
    elif dtype.is_floating_point:
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(a, b), (a, b)


def test_before_init_every_query_raises_and_the_build_queries_answer(world):
    hvd.shutdown()
    try:
        for query in (hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size,
                      hvd.cross_rank, hvd.mpi_threads_supported):
            with pytest.raises(ValueError, match="has not been initialized"):
                query()
        assert hvd.mpi_built() and hvd.mpi_enabled()
        assert not hvd.gloo_built() and hvd.nccl_built() == 0
        assert isinstance(hvd.nccl_built(), int)
        assert not hvd.is_initialized()
    finally:
        hvd.init()
    hvd.init()  # a second call is a no-op
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (world.rank, world.size)
    assert (hvd.local_rank(), hvd.local_size()) == (world.local_rank, world.local_size)
    assert hvd.cross_size() == world.num_nodes
    assert isinstance(hvd.is_homogeneous(), bool)


@pytest.mark.parametrize("dtype, dims", list(itertools.product(DTYPES, [0, 1, 2, 3])))
def test_allreduce_sum_and_average_match_the_closed_form(dtype, dims):
    shape = (17,) * dims
    inputs = _all(shape, dtype, salt=dims)
    mine = inputs[hvd.rank()].clone()
    wide = torch.stack([t.to(torch.float64) for t in inputs])
    summed = hvd.allreduce(mine, op=hvd.Sum, name=f"sum.{dtype}.{dims}")
    _close(summed, wide.sum(0).to(dtype), dtype)
    assert torch.equal(mine, inputs[hvd.rank()]), "the input must not be modified"
    averaged = hvd.allreduce(mine, name=f"avg.{dtype}.{dims}")
    expected = wide.sum(0) / hvd.size()
    expected = expected.to(dtype) if dtype.is_floating_point else expected.trunc().to(dtype)
    _close(averaged, expected, dtype)


@pytest.mark.parametrize("op, reduce", [(hvd.Min, torch.amin), (hvd.Max, torch.amax),
                                        (hvd.Product, torch.prod)])
def test_allreduce_min_max_product(op, reduce):
    inputs = _all((4, 5), torch.float64, salt=op)
    out = hvd.allreduce(inputs[hvd.rank()], op=op)
    _close(out, reduce(torch.stack(inputs), 0), torch.float64)


def test_allreduce_in_place_async_and_scaling():
    inputs = _all((9,), torch.float32, salt=3)
    total = torch.stack(inputs).sum(0)
    t = inputs[hvd.rank()].clone()
    handle = hvd.allreduce_async_(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    out = hvd.synchronize(handle)
    assert out.data_ptr() == t.data_ptr()
    _close(t, total * 1.5, torch.float32)
    ints = torch.full((4,), 7, dtype=torch.int32)
    scaled = hvd.allreduce(ints, op=hvd.Sum, postscale_factor=0.5)
    assert torch.equal(scaled, torch.full((4,), int(7 * hvd.size() * 0.5), dtype=torch.int32))


def test_average_argument_is_deprecated_and_conflicts_with_op():
    t = torch.ones(3)
    with pytest.warns(DeprecationWarning):
        summed = hvd.allreduce(t, average=False)
    assert torch.equal(summed, t * hvd.size())
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(t, average=True, op=hvd.Sum)


def test_names_match_in_any_order_per_rank():
    names = [f"order.{k}" for k in range(6)]
    mine = names if hvd.rank() % 2 == 0 else list(reversed(names))
    handles = {n: hvd.allreduce_async(torch.full((3,), float(k)), name=n, op=hvd.Sum)
               for k, n in sorted(enumerate(names), key=lambda kv: mine.index(kv[1]))}
    for k, name in enumerate(names):
        assert torch.equal(hvd.synchronize(handles[name]), torch.full((3,), float(k * hvd.size())))


def test_a_duplicate_name_in_flight_is_refused_at_once():
    # Horovod's own case: rank 0 starts it alone, then waits in a barrier the others
    # reach before they start theirs: the barrier must complete past the pending name.
    t = torch.ones(17, 17)
    if hvd.rank() == 0:
        first = hvd.allreduce_async(t, name="duplicate_name")
        with pytest.raises(ValueError, match="duplicate_name"):
            hvd.allreduce_async(t, name="duplicate_name")
    hvd.barrier()
    if hvd.rank() > 0:
        first = hvd.allreduce_async(t, name="duplicate_name")
        with pytest.raises(ValueError, match="duplicate_name"):
            hvd.allreduce_async(t, name="duplicate_name")
    assert torch.equal(hvd.synchronize(first), t)
    hvd.barrier()


@pytest.mark.parametrize("field", ["shape", "dtype", "op", "root"])
def test_a_mismatch_raises_on_every_rank_naming_the_tensor_and_ranks(field):
    last = hvd.rank() == hvd.size() - 1
    name = f"mismatch.{field}"
    if field == "shape":
        start = lambda: hvd.allreduce_async(torch.ones(3 + last), name=name)  # noqa: E731
    elif field == "dtype":
        start = lambda: hvd.allreduce_async(  # noqa: E731
            torch.ones(3, dtype=torch.float64 if last else torch.float32), name=name)
    elif field == "op":
        start = lambda: hvd.allreduce_async(torch.ones(3), name=name,  # noqa: E731
                                            op=hvd.Max if last else hvd.Sum)
    else:
        start = lambda: hvd.broadcast_async(torch.ones(3), root_rank=int(last),  # noqa: E731
                                            name=name)
    handle = start()
    with pytest.raises(hvd.HorovodInternalError) as caught:
        hvd.synchronize(handle)
    message = str(caught.value)
    assert name in message and f"rank {hvd.size() - 1}" in message, message
    # The engine goes on: the same name works once the ranks agree.
    assert torch.equal(hvd.allreduce(torch.ones(2), name=name, op=hvd.Sum),
                       torch.full((2,), float(hvd.size())))


def test_one_name_in_two_kinds_is_two_operations():
    # As in Horovod, whose tensors are named allreduce.<name>, allgather.<name>: both in
    # flight at once on a rank, each matched with its own kind on the others, whichever
    # the ranks start first.
    t = torch.full((2,), float(hvd.rank()))
    kinds = [lambda: hvd.allgather_async(t, name="shared"),
             lambda: hvd.allreduce_async(t, name="shared", op=hvd.Sum)]
    first, second = kinds if hvd.rank() % 2 else kinds[::-1]
    a, b = first(), second()
    gathered, summed = (hvd.synchronize(a), hvd.synchronize(b)) if hvd.rank() % 2 else (
        hvd.synchronize(b), hvd.synchronize(a))
    n = hvd.size()
    assert torch.equal(gathered, torch.arange(n, dtype=t.dtype).repeat_interleave(2))
    assert torch.equal(summed, torch.full((2,), float(sum(range(n)))))
    with pytest.raises(ValueError, match="another allgather named 'shared'"):
        handle = hvd.allgather_async(t, name="shared")
        hvd.allgather_async(t, name="shared")
    hvd.synchronize(handle)
    hvd.barrier()


def test_poll_completes_while_the_caller_computes():
    handle = hvd.allreduce_async(torch.ones(1 << 16), name="poll", op=hvd.Sum)
    deadline = time.monotonic() + 30
    while not hvd.poll(handle):  # no synchronize: the engine's thread moves it
        assert time.monotonic() < deadline, "the handle never completed without a wait"
        sum(range(1000))
    assert torch.equal(hvd.synchronize(handle), torch.full((1 << 16,), float(hvd.size())))


def test_allreduce_gradient_is_the_allreduce_of_the_gradient():
    w = torch.ones(5, requires_grad=True)
    scale = float(hvd.rank() + 1)
    hvd.allreduce(w * scale, op=hvd.Sum).sum().backward()
    assert torch.equal(w.grad, torch.full((5,), hvd.size() * scale))
    v = torch.ones(4, requires_grad=True)
    hvd.allreduce(v, op=hvd.Average).sum().backward()
    assert torch.equal(v.grad, torch.ones(4))


def test_grouped_allreduce_fuses_and_completes_together():
    shapes = [(3,), (2, 2), (5,)]
    tensors = [_input(hvd.rank(), s, torch.float32, salt=k) for k, s in enumerate(shapes)]
    out = hvd.grouped_allreduce(tensors, op=hvd.Sum)
    for k, (shape, result) in enumerate(zip(shapes, out)):
        expected = torch.stack([_input(r, shape, torch.float32, salt=k)
                                for r in range(hvd.size())]).sum(0)
        _close(result, expected, torch.float32)
    in_place = [t.clone() for t in tensors]
    hvd.grouped_allreduce_(in_place, op=hvd.Sum)
    for got, want in zip(in_place, out):
        _close(got, want, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_concatenates_rows_that_differ_in_number(dtype):
    rows = [r + 1 for r in range(hvd.size())]
    inputs = [_input(r, (rows[r], 3, 2), dtype) for r in range(hvd.size())]
    out = hvd.allgather(inputs[hvd.rank()])
    assert torch.equal(out, torch.cat(inputs))
    scalar = hvd.allgather(torch.tensor(hvd.rank(), dtype=torch.int64))
    assert torch.equal(scalar, torch.arange(hvd.size()))


def test_allgather_gradient_is_the_own_rows_of_the_averaged_gradient():
    rows = hvd.rank() + 1
    x = torch.ones(rows, 2, requires_grad=True)
    gathered = hvd.allgather(x)
    weights = torch.arange(gathered.shape[0], dtype=torch.float32).unsqueeze(1)
    (gathered * weights).sum().backward()
    offset = sum(r + 1 for r in range(hvd.rank()))
    assert torch.equal(x.grad, weights[offset:offset + rows].expand(rows, 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_from_each_root(dtype):
    for root in range(hvd.size()):
        inputs = _all((4, 3), dtype, salt=root)
        mine = inputs[hvd.rank()].clone()
        out = hvd.broadcast(mine, root_rank=root)
        assert torch.equal(out, inputs[root])
        assert torch.equal(mine, inputs[hvd.rank()])
        hvd.broadcast_(mine, root_rank=root)
        assert torch.equal(mine, inputs[root])


def test_broadcast_gradient_is_zero_off_the_root():
    x = torch.ones(3, requires_grad=True)
    hvd.broadcast(x, root_rank=0).sum().backward()
    assert torch.equal(x.grad, torch.ones(3) if hvd.rank() == 0 else torch.zeros(3))
    with pytest.raises(ValueError, match="root_rank"):
        hvd.broadcast(torch.ones(1), root_rank=hvd.size())


def test_alltoall_with_and_without_splits():
    n, me = hvd.size(), hvd.rank()
    # rank r sends (r + k + 1) rows to rank k, each row holding (r, k).
    sends = [[r + k + 1 for k in range(n)] for r in range(n)]
    rows = torch.cat([torch.tensor([[me, k]] * sends[me][k]) for k in range(n)])
    out, received = hvd.alltoall(rows, splits=sends[me])
    expected = torch.cat([torch.tensor([[r, me]] * sends[r][me]) for r in range(n)])
    assert torch.equal(out, expected)
    assert received.tolist() == [sends[r][me] for r in range(n)]
    even = hvd.alltoall(torch.arange(2 * n) + 100 * me)  # one tensor without splits
    assert even.tolist() == [100 * r + 2 * me + j for r in range(n) for j in range(2)]
    # Rows past the splits' sum are not sent.
    few, got = hvd.alltoall(torch.arange(n + 1) + 100 * me, splits=torch.ones(n, dtype=torch.int32))
    assert few.tolist() == [100 * r + me for r in range(n)] and got.tolist() == [1] * n


def test_alltoall_refuses_on_the_rank_what_cannot_be_split():
    n = hvd.size()
    with pytest.raises(ValueError, match="do not divide among"):
        hvd.alltoall(torch.ones(n + 1))
    with pytest.raises(ValueError, match="more than the tensor's"):
        hvd.alltoall(torch.ones(n - 1), splits=torch.ones(n, dtype=torch.int32))
    with pytest.raises(ValueError, match="torch.int32"):
        hvd.alltoall(torch.ones(n), splits=torch.ones(n))


def test_alltoall_gradient_goes_back_the_way_it_came():
    n, me = hvd.size(), hvd.rank()
    x = torch.ones(2 * n, requires_grad=True)
    out = hvd.alltoall(x * (me + 1))
    (out * torch.arange(out.numel(), dtype=torch.float32)).sum().backward()
    # Row j of this rank went to rank j // 2 as its row 2 * me + j % 2.
    expected = torch.tensor([(2 * me + j % 2) * (me + 1) for j in range(2 * n)],
                            dtype=torch.float32)
    assert torch.equal(x.grad, expected)


@pytest.mark.parametrize("rows", [7, 4, 1])
def test_reducescatter_keeps_this_ranks_rows_earlier_ranks_one_more(rows):
    inputs = _all((rows, 3), torch.float64, salt=rows)
    total = torch.stack(inputs).sum(0)
    n, me = hvd.size(), hvd.rank()
    counts = [rows // n + (1 if r < rows % n else 0) for r in range(n)]
    start = sum(counts[:me])
    out = hvd.reducescatter(inputs[me], op=hvd.Sum)
    _close(out, total[start:start + counts[me]], torch.float64)
    avg = hvd.reducescatter(inputs[me])
    _close(avg, total[start:start + counts[me]] / n, torch.float64)


def test_process_sets_run_collectives_on_their_ranks_only():
    n, me = hvd.size(), hvd.rank()
    evens = hvd.ProcessSet(range(0, n, 2))
    hvd.shutdown()
    hvd.init(process_sets=[evens])
    assert evens.process_set_id is not None and evens.size() == len(range(0, n, 2))
    assert hvd.global_process_set.ranks == list(range(n))
    if evens.included():
        assert evens.rank() == me // 2
        out = hvd.allreduce(torch.tensor([float(me)]), op=hvd.Sum, process_set=evens)
        assert out.item() == float(sum(range(0, n, 2)))
        b = hvd.broadcast(torch.tensor([float(me)]), root_rank=0, process_set=evens)
        assert b.item() == 0.0
    else:
        with pytest.raises(ValueError, match="not part of"):
            evens.rank()
        with pytest.raises(ValueError, match="does not include this process"):
            hvd.allreduce(torch.ones(1), process_set=evens)
    with pytest.raises(ValueError, match="HOROVOD_DYNAMIC_PROCESS_SETS"):
        hvd.add_process_set([0])
    hvd.barrier()


def test_dynamic_process_sets_are_added_and_removed(monkeypatch):
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    n, me = hvd.size(), hvd.rank()
    last_two = hvd.add_process_set(list(range(1, n)))  # every rank but rank 0
    with pytest.raises(ValueError, match="duplicate"):
        hvd.add_process_set(list(range(1, n)))
    if last_two.included():
        out = hvd.allgather(torch.tensor([me]), process_set=last_two)
        assert out.tolist() == list(range(1, n))
    assert hvd.remove_process_set(last_two)
    assert last_two.process_set_id is None
    assert not hvd.remove_process_set(hvd.global_process_set)


def test_sets_without_rank_0_are_used_and_removed_over_and_over(monkeypatch):
    # Rank 0 coordinates a set it is not in: once it has sent the set's last response,
    # the members may finish, and every rank remove the set, while rank 0's engine is
    # still in the cycle that sent it (an engine that looked the set up again there
    # stopped within a few dozen rounds at 2 ranks).
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    n, me = hvd.size(), hvd.rank()
    for round_ in range(150):
        others = hvd.add_process_set(list(range(1, n)))
        if others.included():
            out = hvd.allgather(torch.tensor([me, round_]), process_set=others)
            assert out.tolist() == [v for r in range(1, n) for v in (r, round_)]
        assert hvd.remove_process_set(others)
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum).item() == n


def test_sparse_allreduce_gathers_indices_and_values():
    me, n = hvd.rank(), hvd.size()
    t = torch.sparse_coo_tensor(torch.tensor([[me]]), torch.tensor([1.0 + me]), (n,))
    out = hvd.sparse_allreduce_async(t, name="sparse", op=hvd.Sum)()
    assert torch.equal(out.to_dense(), torch.arange(1, n + 1, dtype=torch.float32))


@pytest.mark.parametrize("first", ["each rank"])
def test_join_contributes_zeros_and_returns_the_last_rank(first):
    size = hvd.size()
    for first_rank in range(size):
        a = _input(hvd.rank(), (5, 3), torch.float64, salt=first_rank)
        b = _input(hvd.rank(), (17,), torch.int64, salt=first_rank)
        if hvd.rank() == first_rank:
            last = hvd.join()
        else:
            ha = hvd.allreduce_async(a, name="join.a", op=hvd.Average)
            hb = hvd.allreduce_async(b, name="join.b", op=hvd.Sum)
            got_a, got_b = hvd.synchronize(ha), hvd.synchronize(hb)
            others = [r for r in range(size) if r != first_rank]
            # The joined rank adds zeros; the average still divides by the full size.
            _close(got_a, sum(_input(r, (5, 3), torch.float64, first_rank) for r in others)
                   / size, torch.float64)
            _close(got_b, sum(_input(r, (17,), torch.int64, first_rank) for r in others),
                   torch.int64)
            last = hvd.join()
        assert last != first_rank or size == 1
        assert hvd.allgather_object(last) == [last] * size


@pytest.mark.parametrize("kind", ["allgather", "broadcast"])
def test_a_gather_or_broadcast_beside_a_joined_rank_fails_on_the_others(kind):
    if hvd.size() == 1:
        pytest.skip("needs two ranks")
    for first_rank in range(hvd.size()):
        if hvd.rank() == first_rank:
            hvd.join()
            continue
        with pytest.raises(RuntimeError, match="joined"):
            if kind == "allgather":
                hvd.allgather(torch.ones(4, 2), name="join.gather")
            else:
                hvd.broadcast(torch.ones(4), root_rank=hvd.rank(), name="join.bcast")
        hvd.join()


def test_an_optimizer_step_beside_a_joined_rank():
    # Uneven data: a rank out of batches joins; the others' steps average in its zeros.
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1, bias=False)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    w0 = model.weight.detach().clone()
    steps = 1 + hvd.rank()            # rank r has r + 1 batches
    for _ in range(steps):
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
    hvd.join()
    # Step k runs on the ranks with more than k batches, the gradient ones(3) on each of
    # them and zeros from the joined; a joined rank's weights stay where its steps left
    # them (Horovod's users broadcast them after the join).
    expected = w0.clone()
    for k in range(steps):
        expected -= torch.ones(1, 3) * (hvd.size() - k) / hvd.size()
    torch.testing.assert_close(model.weight.detach(), expected)


def _adasum_by_hand(vectors):
    """Adasum's pairwise rule in numpy float64, neighbours first, then pairs of pairs."""
    import numpy as np

    level = [np.asarray(v, dtype=np.float64) for v in vectors]
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[0::2], level[1::2]):
            dot = float(a @ b)
            nxt.append((1 - dot / (2 * (a @ a))) * a + (1 - dot / (2 * (b @ b))) * b)
        level = nxt
    return level[0]


def test_adasum_follows_its_rule_and_refuses_what_it_cannot_combine():
    n = hvd.size()
    if n & (n - 1):
        with pytest.raises(ValueError, match="needs a power of two"):
            hvd.allreduce(torch.ones(3), op=hvd.Adasum)
        return
    inputs = [x.reshape(-1) for x in _all((5, 3), torch.float64, salt=41)]
    out = hvd.allreduce(inputs[hvd.rank()].reshape(5, 3), op=hvd.Adasum)
    expected = torch.from_numpy(_adasum_by_hand([x.numpy() for x in inputs])).reshape(5, 3)
    torch.testing.assert_close(out, expected)
    # Fused with another tensor, each keeps its own dot products.
    other = [x.reshape(-1) for x in _all((4,), torch.float64, salt=42)]
    a, b = hvd.grouped_allreduce([inputs[hvd.rank()], other[hvd.rank()]], op=hvd.Adasum)
    torch.testing.assert_close(a, expected.reshape(-1))
    torch.testing.assert_close(
        b, torch.from_numpy(_adasum_by_hand([x.numpy() for x in other])))
    # The same gradient everywhere stays itself (no sum); orthogonal ones add.
    same = hvd.allreduce(torch.tensor([1.0, -2.0, 4.0]), op=hvd.Adasum)
    torch.testing.assert_close(same, torch.tensor([1.0, -2.0, 4.0]))
    basis = torch.zeros(n)
    basis[hvd.rank()] = hvd.rank() + 1.0
    torch.testing.assert_close(hvd.allreduce(basis, op=hvd.Adasum),
                               torch.arange(1.0, n + 1))
    with pytest.raises(ValueError, match="floating-point gradients only"):
        hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum)


def test_start_and_stop_timeline_write_each_tensors_lane(tmp_path_factory, monkeypatch):
    import json

    monkeypatch.setenv("HOROVOD_TIMELINE", "DYNAMIC")  # as Horovod, which refuses without
    folder = tmp_path_factory.getbasetemp() / "hvd-timeline"  # rank 0 writes, to its own
    first, second = folder / "first.json", folder / "second.json"
    hvd.start_timeline(str(first))
    hvd.start_timeline(str(first))  # again: the same recording goes on
    hvd.allreduce(torch.ones(3), name="timed_allreduce")
    hvd.start_timeline(str(second))  # another file: the first is written
    hvd.broadcast(torch.ones(2), root_rank=0, name="timed_broadcast")
    hvd.stop_timeline()
    hvd.stop_timeline()  # nothing left to stop
    if hvd.rank() != 0:
        return
    for path, lane, kinds in ((first, "allreduce.timed_allreduce", ["NEGOTIATE_ALLREDUCE",
                                                                    "ALLREDUCE"]),
                              (second, "broadcast.timed_broadcast", ["NEGOTIATE_BROADCAST",
                                                                     "BROADCAST"])):
        events = json.loads(path.read_text())["traceEvents"]
        lanes = {(e["pid"], e["tid"]) for e in events
                 if e["ph"] == "M" and e["name"] == "thread_name" and e["args"]["name"] == lane}
        assert {pid for pid, _ in lanes} == set(range(hvd.size())), path
        spans = sorted((e for e in events if e["ph"] == "X" and (e["pid"], e["tid"]) in lanes
                        and e["pid"] == 0), key=lambda e: e["ts"])
        assert [e["name"] for e in spans] == kinds, path


def test_reducescatter_refuses_adasum_at_once_on_every_rank():
    with pytest.raises(hvd.HorovodInternalError, match="does not support op=hvd.Adasum"):
        hvd.reducescatter(torch.ones(2 * hvd.size()), op=hvd.Adasum)
    hvd.barrier()  # nothing was started: the ranks go on together
