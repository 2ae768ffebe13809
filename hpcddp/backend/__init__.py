"""The ``"hpcddp"`` torch.distributed backend: torch's collectives on hpcddp's transport.

- ``torch_init.py``: the backend registered with torch as torch.distributed is imported
  (``init_process_group("hpcddp")`` and ``env://`` under an MPI launcher, rendezvous
  through MPI), and the check that catches a rank training alone.
- ``process_group.py``: ``MPIProcessGroup``, every collective and point-to-point call of a
  ``ProcessGroup`` issued on a ``Transport``.
- ``work.py``: its ``Work`` objects and futures, completed in the background.
- ``groups.py``: the default group and subgroups, each on a communicator of its own.
- ``shared_store.py``: rank 0's ``TCPStore``, opened when a rank first asks for it
  through MPI, for groups of other backends beside hpcddp's.

Importing this package starts nothing; ``process_group`` and ``groups`` start MPI when
imported.
"""
