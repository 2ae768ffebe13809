"""What happens when a rank fails or stops: the watchdog that names a stuck rank
(``watchdog``, the nodes it names in ``suspects``), the abort that ends every rank
(``abort``), the reports each rank leaves (``report``), the guard that ends the
launcher when MPI does not (``launcher_guard``), the ranks and nodes MPI says have
failed (``failed``, ULFM), and the check that every rank calls the same collective
(``fingerprint``). Built on ``hpcddp.comm``; nothing in ``hpcddp.comm`` imports it.

Importing this package starts nothing: ``mpi4py.MPI`` is imported when one of the names
below is first used.
"""

from hpcddp.lazy import lazy_names

_PUBLIC = {
    "install_abort_hook": ".abort", "abort_job": ".abort",
}

__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names(__name__, _PUBLIC)
