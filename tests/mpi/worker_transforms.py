"""Transforms for the loader's worker tests, in a module a spawned worker can import.

It imports ``mpi4py.MPI`` at the top, as a training script often does: in a loader worker
that import must not initialize MPI.
"""

import os
import random

import numpy as np
import torch
from mpi4py import MPI

CROP = 6


def crop_and_flip(sample):
    """A random window of the encoded bytes (zero-padded), flipped half the time, with
    torch's, NumPy's and Python's generators all drawn from."""
    image, name, label = sample
    padded = torch.zeros(len(image) + CROP, dtype=torch.uint8)
    padded[:len(image)] = image
    start = int(torch.randint(0, len(image) + 1, ()))
    window = padded[start:start + CROP].clone()
    if random.random() < 0.5:
        window = window.flip(0)
    noise = torch.tensor(np.random.randint(0, 1000))
    return window, label, noise, len(name)


def with_process(sample):
    """The sample's label, whether MPI is initialized here, and this process's id."""
    return sample[2], torch.tensor(MPI.Is_initialized()), torch.tensor(os.getpid())


def scale_batch(batch):
    window, label, noise, length = batch
    return window.float() * torch.rand(()), label, noise, length


def fail_on_seven(sample):
    if int(sample[2]) == 7:
        raise ValueError("sample 7 is damaged")
    return sample[2]
