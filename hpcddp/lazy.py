"""Package faces whose public names load their modules on first use (PEP 562).

Import is not initialization: ``import hpcddp`` must not import torch, h5py or
``mpi4py.MPI`` (whose import calls ``MPI_Init``). A package face lists its public names
with the module each lives in, and this makes the module-level ``__getattr__`` and
``__dir__`` that import it when the name is first asked for.
"""

import importlib
import sys
from typing import Callable, Dict, Tuple

__all__ = ["lazy_names"]


def lazy_names(package: str, public: Dict[str, str]) -> Tuple[Callable, Callable]:
    """Return ``(__getattr__, __dir__)`` for the package ``package``.

    Args:
        package: the package's ``__name__``.
        public: each public name, and the module (absolute, or relative to ``package``
            when it starts with a dot) that defines it.

    Example::

        __getattr__, __dir__ = lazy_names(__name__, {"H5Dataset": ".dataset"})
    """
    def __getattr__(name):
        if name not in public:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(public[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(public))

    return __getattr__, __dir__
