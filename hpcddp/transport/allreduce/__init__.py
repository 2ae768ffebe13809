"""How an allreduce is carried out, and which way each buffer takes.

- ``policy``: every choice of algorithm, made in one place (for the world at
  ``init()``, for each buffer, for the autotuner), and ``Reductions``, a communicator's
  algorithms made on first use;
- ``mpi``: the interface every algorithm has (``Reduction``), and MPI's own
  ``Iallreduce``;
- ``ring``: hpcddp's ring of non-blocking point-to-point messages, combined by torch
  kernels;
- ``node_aware``: inside the node, across nodes, inside the node again.

Each ``start()`` returns a request (something with ``Test()`` and ``Wait()``).
"""
