"""Models and data shared by the DDP tests: deterministic on every rank."""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

BATCH = 4  # per rank


class MLP(nn.Module):
    def __init__(self, width=16, depth=3):
        super().__init__()
        layers = [nn.Linear(8, width), nn.Tanh()]
        for _ in range(depth - 1):
            layers += [nn.Linear(width, width), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(self.body(x))


class Tied(nn.Module):
    """An embedding whose weight is also the output projection's."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.mix = nn.Linear(8, 8)
        self.out = nn.Linear(8, 10, bias=False)
        self.out.weight = self.embed.weight

    def forward(self, x):
        return self.out(torch.tanh(self.mix(self.embed(x))))


class Transposed(nn.Module):
    """A linear layer whose weight is stored transposed: its gradient is not contiguous."""

    def __init__(self, width=32):
        super().__init__()
        self.weight_t = nn.Parameter(torch.randn(width, 8).t() / 4)  # an (8, width) view
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(torch.tanh(x @ self.weight_t))


class Checkpointed(MLP):
    def forward(self, x):
        return self.head(checkpoint(self.body, x, use_reentrant=False))


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 6 * 6, 3)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class SometimesUnused(nn.Module):
    """``extra`` is used on rank 0 only; ``never`` is never used."""

    def __init__(self, rank):
        super().__init__()
        self.rank = rank
        self.main = nn.Linear(8, 3)
        self.extra = nn.Linear(8, 3)
        self.never = nn.Linear(8, 3)

    def forward(self, x):
        out = self.main(x)
        return out + self.extra(x) if self.rank == 0 else out


def global_batch(step, size, kind="dense"):
    """The global batch of ``step``; rank r's share is rows [r*BATCH, (r+1)*BATCH)."""
    g = torch.Generator().manual_seed(1234 + step)
    n = BATCH * size
    if kind == "tokens":
        return torch.randint(0, 10, (n,), generator=g), torch.randint(0, 10, (n,), generator=g)
    if kind == "image":
        return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 3, (n,), generator=g)
    return torch.randn(n, 8, generator=g), torch.randn(n, 3, generator=g)


def share(tensor, rank):
    return tensor[rank * BATCH:(rank + 1) * BATCH]
