"""Models, data and a single-process reference shared by the torch-parallelism tests."""

import copy

import torch
from torch import nn

GLOBAL_BATCH = 12  # divisible by 2, 3 and 4 ranks
STEPS = 3


class Block(nn.Module):
    """A residual MLP block, the unit FSDP2 shards and tensor parallelism splits."""

    def __init__(self, width=12):
        super().__init__()
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(torch.tanh(self.up(x)))


class Net(nn.Module):
    def __init__(self, width=12, depth=3):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 3)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def make_net(seed=0, **kw) -> Net:
    torch.manual_seed(seed)
    return Net(**kw)


def batches(steps=STEPS, seed=1):
    """The global batches: the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(GLOBAL_BATCH, 8, generator=g),
             torch.randint(0, 3, (GLOBAL_BATCH,), generator=g)) for _ in range(steps)]


def shard_of(tensor, rank, size):
    """This data-parallel rank's part of a global batch."""
    per = tensor.shape[0] // size
    return tensor[rank * per:(rank + 1) * per]


def loss_fn(out, y):
    return nn.functional.cross_entropy(out, y)


def train_single(model, data, make_opt, param_dtype=None):
    """Single-process training on the global batches (the reference). With
    ``param_dtype``, forward and backward run on a copy in that dtype and the gradients
    are applied in float32, as FSDP2's mixed precision does."""
    model = copy.deepcopy(model)
    opt = make_opt(model.parameters())
    for x, y in data:
        opt.zero_grad()
        if param_dtype is None:
            loss_fn(model(x), y).backward()
        else:
            low = copy.deepcopy(model).to(param_dtype)
            loss_fn(low(x.to(param_dtype)).float(), y).backward()
            for p, q in zip(model.parameters(), low.parameters()):
                p.grad = q.grad.float()
        opt.step()
    return model


def full_state(model):
    """Every parameter as a whole tensor (DTensors gathered), by name."""
    out = {}
    for name, p in model.named_parameters():
        out[name] = (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float()
    return out


def assert_states_close(ours, ref, **tol):
    ref = {k: v.detach().float() for k, v in ref.items()}
    assert ours.keys() == ref.keys()
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], msg=name, **tol)


def states_differ(a, b, atol=1e-4):
    return any(not torch.allclose(a[k], b[k], atol=atol) for k in a)
