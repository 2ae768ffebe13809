"""``hvd.DistributedOptimizer`` and the helpers that start every rank alike, against
references computed in the test: a model trained in one process on the global batch
(each rank holds an equal share, so the average of the ranks' mean losses is the global
mean), and the root's state built again on every rank from the root's seed.
"""

import warnings

import pytest
import torch
from torch import nn

import hpcddp.horovod as hvd


@pytest.fixture(scope="module", autouse=True)
def horovod(world):
    hvd.init()
    yield
    hvd.shutdown()


def _model(seed, bias=True):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8, bias=bias), nn.Tanh(), nn.Linear(8, 3, bias=bias))


def _batches(steps, per_rank):
    g = torch.Generator().manual_seed(11)
    total = per_rank * hvd.size()
    return [(torch.randn(total, 6, generator=g), torch.randn(total, 3, generator=g))
            for _ in range(steps)]


def _share(tensor):
    return tensor[hvd.rank()::hvd.size()]


def _train_reference(make_opt, batches, passes=1, seed=3, bias=True):
    model = _model(seed, bias)
    opt = make_opt(model)
    for k in range(0, len(batches), passes):
        opt.zero_grad()
        for x, y in batches[k:k + passes]:
            nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model


def _train_distributed(make_opt, batches, passes=1, seed=3, bias=True, **kwargs):
    model = _model(seed + 100 * hvd.rank(), bias)  # unlike on every rank, until broadcast
    opt = hvd.DistributedOptimizer(make_opt(model), named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **kwargs)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    for k in range(0, len(batches), passes):
        opt.zero_grad()
        for x, y in batches[k:k + passes]:
            nn.functional.mse_loss(model(_share(x)), _share(y)).backward()
        opt.step()
    return model, opt


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def _assert_same(model, reference, tol=1e-5):
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=tol, atol=tol, msg=name)


def _every_torch_optimizer():
    """torch.optim's classes but LBFGS (refused) and SparseAdam (sparse gradients only)."""
    left_out = (torch.optim.LBFGS, torch.optim.SparseAdam)
    return sorted((c for c in torch.optim.Optimizer.__subclasses__()
                   if c.__module__.startswith("torch.optim") and c not in left_out),
                  key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", _every_torch_optimizer(), ids=lambda c: c.__name__)
def test_every_torch_optimizer_trains_as_one_process_from_broadcast_state(cls):
    # Weights only (Muon takes 2-D parameters only). broadcast_optimizer_state makes a
    # fresh state as Horovod documents: one step with zero gradients (Adam's count then
    # starts at 1); the reference takes that step too.
    def make(model):
        return cls(model.parameters(), lr=0.01)

    def make_stepped(model):
        opt = make(model)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        return opt

    batches = _batches(3, 2)
    reference = _train_reference(make_stepped, batches, bias=False)
    model, _ = _train_distributed(make, batches, bias=False)
    _assert_same(model, reference, tol=1e-4)


@pytest.mark.parametrize("kwargs", [{}, {"groups": 2}, {"num_groups": 3}, {"op": hvd.Sum},
                                    {"gradient_predivide_factor": 2.0}],
                         ids=["plain", "groups", "num_groups", "sum", "predivide"])
def test_training_follows_one_process_on_the_global_batch(kwargs):
    batches = _batches(5, per_rank=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model, opt = _train_distributed(_sgd, batches, **kwargs)
    if kwargs.get("op") == hvd.Sum:
        # The sum of the ranks' mean gradients: size times the global mean's, so the
        # reference's learning rate is size times as large.
        def sgd_sum(m):
            return torch.optim.SGD(m.parameters(), lr=0.1 * hvd.size(), momentum=0.9)
        reference = _train_reference(sgd_sum, batches)
    else:
        reference = _train_reference(_sgd, batches)
    _assert_same(model, reference)
    assert isinstance(opt, torch.optim.SGD) and type(opt).__name__ == "SGD"
    assert opt.state_dict().keys() == _sgd(_model(0)).state_dict().keys()


def test_groups_given_as_lists_of_parameters():
    batches = _batches(3, per_rank=2)
    model = _model(3)
    params = list(model.parameters())
    opt = hvd.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters(),
                                   groups=[[params[0], params[3]], [params[1]]])
    for x, y in batches:
        opt.zero_grad()
        nn.functional.mse_loss(model(_share(x)), _share(y)).backward()
        opt.step()
    _assert_same(model, _train_reference(_sgd, batches))


def test_backward_passes_per_step_accumulates_then_refuses_one_more():
    batches = _batches(6, per_rank=2)
    model, opt = _train_distributed(_sgd, batches, passes=2)
    _assert_same(model, _train_reference(_sgd, batches, passes=2))
    x, y = batches[0]
    for _ in range(2):
        nn.functional.mse_loss(model(_share(x)), _share(y)).backward()
    with pytest.raises(AssertionError, match="more than backward_passes_per_step times"):
        nn.functional.mse_loss(model(_share(x)), _share(y)).backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    opt.set_backward_passes_per_step(1)
    assert opt.backward_passes_per_step == 1


def test_fp16_compression_stays_within_half_precision():
    batches = _batches(3, per_rank=4)
    model, _ = _train_distributed(_sgd, batches, compression=hvd.Compression.fp16)
    _assert_same(model, _train_reference(_sgd, batches), tol=5e-3)


def test_a_gradient_one_rank_did_not_compute_is_averaged_with_zeros():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD([*a.parameters(), *b.parameters()], lr=1.0),
        named_parameters=[*(("a." + n, p) for n, p in a.named_parameters()),
                          *(("b." + n, p) for n, p in b.named_parameters())])
    x = torch.arange(4.0)
    out = a(x) + (b(x) if hvd.rank() == 0 else 0)
    out.sum().backward()
    opt.synchronize()
    # d out / d b.weight = x on rank 0, nothing elsewhere: the average is x / size.
    torch.testing.assert_close(b.weight.grad, (x / hvd.size()).reshape(1, 4))
    torch.testing.assert_close(a.weight.grad, x.reshape(1, 4))
    with opt.skip_synchronize():
        opt.step()


def test_zero_grad_refused_while_reductions_are_pending_and_step_after_synchronize_warns():
    model = _model(1)
    opt = hvd.DistributedOptimizer(_sgd(model), named_parameters=model.named_parameters())
    model(torch.ones(2, 6)).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad\\(\\) was called after"):
        opt.zero_grad()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()
    opt.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(sparse_as_dense):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 10, (hvd.size(), 3), generator=g)

    def embedding():
        torch.manual_seed(2)
        return nn.Embedding(10, 4, sparse=True)

    reference = embedding()
    torch.optim.SGD(reference.parameters(), lr=0.5).zero_grad()
    reference(ids).sum().div(hvd.size()).backward()
    with torch.no_grad():
        reference.weight -= 0.5 * reference.weight.grad.to_dense()
    model = embedding()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    model(ids[hvd.rank()]).sum().backward()
    opt.step()
    torch.testing.assert_close(model.weight, reference.weight)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_adam_gets_the_averaged_gradient_still_sparse(sparse_as_dense):
    # SparseAdam refuses dense gradients: sent dense, the average comes back sparse.
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(0, 10, (hvd.size(), 3), generator=g)

    def embedding():
        torch.manual_seed(3)
        return nn.Embedding(10, 4, sparse=True)

    reference = embedding()
    reference(ids).sum().div(hvd.size()).backward()
    torch.optim.SparseAdam(list(reference.parameters()), lr=0.1).step()
    model = embedding()
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(model.parameters()), lr=0.1),
                                   named_parameters=model.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    model(ids[hvd.rank()]).sum().backward()
    opt.step()
    assert model.weight.grad.is_sparse
    torch.testing.assert_close(model.weight, reference.weight)


def test_bad_arguments_say_what_is_wrong():
    model = _model(1)
    with pytest.raises(ValueError, match="sequence of tuples"):
        hvd.DistributedOptimizer(_sgd(model), named_parameters=list(model.parameters()))
    with pytest.raises(ValueError, match="must be unique. Found duplicates: w"):
        hvd.DistributedOptimizer(_sgd(model), named_parameters=[("w", p)
                                                                for p in model.parameters()])
    with pytest.raises(ValueError, match="were not named"):
        hvd.DistributedOptimizer(_sgd(model),
                                 named_parameters=list(model.named_parameters())[:1])
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported"):
        hvd.DistributedOptimizer(_sgd(model), op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="groups should be a non-negative integer"):
        hvd.DistributedOptimizer(_sgd(model), groups=-1)


def test_broadcast_parameters_takes_dicts_lists_and_named_pairs():
    root = hvd.size() - 1
    expected = _model(40 + root)
    for form in ("dict", "list", "named"):
        model = _model(40 + hvd.rank())
        params = {"dict": model.state_dict(), "list": list(model.parameters()),
                  "named": list(model.named_parameters())}[form]
        with torch.no_grad():
            hvd.broadcast_parameters(params, root_rank=root)
        _assert_same(model, expected, tol=0)
    with pytest.raises(ValueError, match="invalid params of type"):
        hvd.broadcast_parameters(model.parameters(), root_rank=0)


def _adam(model, rank):
    return torch.optim.Adam(model.parameters(), lr=0.01 * (rank + 1), betas=(0.8, 0.9 + rank / 100))


def test_broadcast_optimizer_state_initialises_and_copies_state_and_options():
    root = 0
    # Fresh: every rank's state is made, the root's options win, their types kept.
    model = _model(7)
    opt = _adam(model, hvd.rank())
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[0]["betas"] == (0.8, 0.9)
    assert isinstance(opt.param_groups[0]["betas"], tuple)
    assert len(opt.state) == 4
    # Stepped differently on each rank: the root's moments on every rank.
    def stepped(rank):
        m = _model(7)
        o = _adam(m, rank)
        for _ in range(rank + 1):
            m(torch.full((2, 6), float(rank))).sum().backward()
            o.step()
        return o
    opt = stepped(hvd.rank())
    expected = stepped(root)
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    for p, q in zip(opt.state.values(), expected.state.values()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            torch.testing.assert_close(p[key], q[key], rtol=0, atol=0)
    assert opt.param_groups[0]["lr"] == expected.param_groups[0]["lr"]
    with pytest.raises(ValueError, match="LBFGS"):
        hvd.broadcast_optimizer_state(torch.optim.LBFGS(model.parameters()), root_rank=0)


def test_broadcast_optimizer_state_of_a_distributed_optimizer_before_its_first_step():
    model = _model(8)
    opt = hvd.DistributedOptimizer(_adam(model, hvd.rank()),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == 0.01 and len(opt.state) == 4


def test_broadcast_object_and_allgather_object():
    obj = {"rank": hvd.rank(), "scale": lambda v: v * (hvd.rank() + 2)}
    got = hvd.broadcast_object(obj, root_rank=1 % hvd.size())
    assert got["rank"] == 1 % hvd.size() and got["scale"](1) == hvd.rank() + 2
    gathered = hvd.allgather_object({"rank": hvd.rank(), "pad": "x" * hvd.rank() * 100})
    assert [g["rank"] for g in gathered] == list(range(hvd.size()))
    assert [len(g["pad"]) for g in gathered] == [r * 100 for r in range(hvd.size())]


def test_adasum_moves_each_parameter_by_the_adasum_of_the_ranks_own_steps():
    import numpy as np

    n, me = hvd.size(), hvd.rank()
    if n & (n - 1):
        pytest.skip("Adasum needs a power-of-two number of ranks (refused: test_horovod_ops)")
    batches = _batches(1, 2)
    x, y = batches[0]

    def local_move(rank):  # what one rank's own SGD step does to each parameter
        model = _model(4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        nn.functional.mse_loss(model(x[rank::n]), y[rank::n]).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        return before, [(p.detach() - b).reshape(-1).double().numpy()
                        for p, b in zip(model.parameters(), before)]

    def adasum(vectors):
        while len(vectors) > 1:
            vectors = [(1 - (a @ b) / (2 * (a @ a))) * a + (1 - (a @ b) / (2 * (b @ b))) * b
                       for a, b in zip(vectors[0::2], vectors[1::2])]
        return vectors[0]

    start, _ = local_move(0)
    moves = [local_move(r)[1] for r in range(n)]
    model = _model(4)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), op=hvd.Adasum)
    nn.functional.mse_loss(model(x[me::n]), y[me::n]).backward()
    opt.step()
    for k, p in enumerate(model.parameters()):
        combined = adasum([m[k] for m in moves])
        expected = start[k] + torch.from_numpy(np.asarray(combined)).float().reshape(p.shape)
        torch.testing.assert_close(p.detach(), expected)
