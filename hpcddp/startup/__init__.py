"""A rank's start and its surroundings, before and beside hpcddp's MPI layer:
``MPI_Init`` bounded in time and the names MPI leaves in ``/dev/shm`` (``mpi_init``),
the MPI library this process loaded and its launcher (``mpi_library``),
multiprocessing's resource tracker outside the launcher's kill (``tracker``), whether
the MPI accepts CUDA device buffers (``cuda_aware``), and the
two-process check of device buffers through MPI (``selftest``). Nothing here imports
torch or ``hpcddp.comm``; ``hpcddp.comm`` builds on it.
"""
