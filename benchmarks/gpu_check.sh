#!/bin/bash
# Run on a GPU machine: the GPU tests (which must not skip there) and the GPU benchmark.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, after `make venv`
#
# Two ranks share the node's GPU(s) (local rank % device count). Results go to
# benchmarks/results/ddp_cuda.json; a missing GPU is a failure, not a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
MPIEXEC=${MPIEXEC:-.venv/bin/mpiexec}
export HPCDDP_TEST_GPU=1
"${PY}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
"${MPIEXEC}" -n 2 "${PY}" -m hpcddp doctor --max-bytes 16777216
timeout -k 10 900 "${MPIEXEC}" -n 2 "${PY}" -m pytest -p hpcddp.testing tests/mpi
timeout -k 10 900 "${MPIEXEC}" -n 2 "${PY}" benchmarks/bench_ddp.py --device cuda
