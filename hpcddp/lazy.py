"""Package faces whose public names load their modules on first use (PEP 562).

Import is not initialization: ``import hpcddp`` must not import torch, h5py or
``mpi4py.MPI`` (whose import calls ``MPI_Init``). A package face lists its public names
with the module each lives in, and this makes the module-level ``__getattr__`` and
``__dir__`` that import it when the name is first asked for. ``after_import`` runs a
function of hpcddp's once another package (torch.distributed) has been imported, by
whoever imports it, without importing it first; ``before_import`` one just before
(``mpi4py.MPI``, whose import starts MPI, which reads its settings then).
"""

import importlib
import importlib.abc
import sys
from typing import Callable, Dict, Tuple

__all__ = ["after_import", "before_import", "later", "lazy_names"]


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


def after_import(module: str, target: str, *args) -> None:
    """Call ``target`` (``"package.module:function"``) with ``args`` once ``module`` is
    imported: now if it already is, else right after whoever imports it has finished
    executing it.
    """
    if module in sys.modules:
        _call(target, *args)
        return
    sys.meta_path.insert(0, _AfterImport(module, target, args=args))


def later(target: str) -> Callable:
    """A function that loads ``target`` (``"package.module:function"``) when first called
    and calls it: how a package face hands a lower layer what a higher one provides,
    without importing the higher one now."""
    def call(*args, **kwargs):
        return _resolve(target)(*args, **kwargs)
    call.__qualname__ = call.__name__ = f"later({target!r})"
    return call


def before_import(module: str, target: str) -> None:
    """Call ``target`` (``"package.module:function"``) just before ``module`` is loaded,
    by whoever imports it; never if it is imported already (too late then)."""
    if module not in sys.modules:
        sys.meta_path.insert(0, _AfterImport(module, target, before=True))


def _resolve(target: str) -> Callable:
    """The function ``"package.module:function"`` names, its module imported now."""
    where, name = target.split(":")
    return getattr(importlib.import_module(where), name)


def _call(target: str, *args) -> None:
    _resolve(target)(*args)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give ``module``."""

    def __init__(self, module: str, target: str, before: bool = False, args=()):
        self.module, self.target, self.before, self.args = module, target, before, args

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) \
                if hasattr(finder, "find_spec") else None
            if spec is not None and spec.loader is not None:
                wrapper = _FirstCall if self.before else _ThenCall
                spec.loader = wrapper(spec.loader, self.target, self.args)
                return spec
        return None


class _ThenCall(importlib.abc.Loader):
    def __init__(self, loader, target: str, args=()):
        self._loader, self._target, self._args = loader, target, args

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _call(self._target, *self._args)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


class _FirstCall(_ThenCall):
    # Before the module is created: an extension module's initialization may run there.
    def create_module(self, spec):
        _call(self._target, *self._args)
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
