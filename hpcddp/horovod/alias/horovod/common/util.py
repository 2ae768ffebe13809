"""``horovod.common.util``, served by hpcddp: the helpers Horovod programs and tests
import from it (the build queries with their ``verbose`` argument, ``env``, the Adasum
size check, ``split_list``)."""

import os
from contextlib import contextmanager

from hpcddp.horovod import basics

__all__ = ["ccl_built", "ddl_built", "env", "get_average_backwards_compatibility_fun",
           "gloo_built", "gpu_available", "is_iterable", "mpi_built", "nccl_built",
           "num_rank_is_power_2", "split_list"]


def mpi_built(verbose=False):
    return basics.mpi_built()


def gloo_built(verbose=False):
    return basics.gloo_built()


def nccl_built(verbose=False):
    return basics.nccl_built()


def ddl_built(verbose=False):
    return basics.ddl_built()


def ccl_built(verbose=False):
    return basics.ccl_built()


def gpu_available(ext_base_name, verbose=False):
    """Whether this framework runs on GPUs here (``ext_base_name``: ``horovod.torch``)."""
    import torch

    return torch.cuda.is_available()


@contextmanager
def env(**variables):
    """Set the environment ``variables`` (None ones are skipped) for the block; each
    goes back to its value before, or away, after it."""
    given = {name: value for name, value in variables.items() if value is not None}
    before = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def get_average_backwards_compatibility_fun(reduce_ops):
    """The ``(op, average) -> op`` rule of the deprecated ``average=`` argument."""
    return basics.check_average


def num_rank_is_power_2(num_rank):
    """Whether Adasum can pair ``num_rank`` ranks recursively (a power of two)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0


def split_list(items, n):
    """``items`` in ``n`` consecutive parts, as even as they go, the first ones longer.

    >>> split_list([1, 2, 3, 4, 5], 2)
    [[1, 2, 3], [4, 5]]
    """
    size, extra = divmod(len(items), n)
    bounds = [k * size + min(k, extra) for k in range(n + 1)]
    return [items[bounds[k]:bounds[k + 1]] for k in range(n)]


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True
