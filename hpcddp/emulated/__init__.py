"""An emulated cluster on one machine: network namespaces as nodes, shaped links, and the
``mpiexec`` arguments that start ranks on them (``hpcddp cluster``). Needs root."""

from hpcddp.lazy import lazy_names

_PUBLIC = {"EmulatedCluster": ".cluster", "Unavailable": ".cluster"}

__all__ = ["EmulatedCluster", "Unavailable"]

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
