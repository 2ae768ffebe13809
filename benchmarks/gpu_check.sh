#!/bin/bash
# Run on a GPU machine: the GPU tests (which must not skip there) and the GPU benchmark.
#
#   bash benchmarks/gpu_check.sh            # from the repository root, after `make venv`
#   PY=python3 MPIEXEC="mpirun --oversubscribe" bash benchmarks/gpu_check.sh   # site stack
#
# Two ranks share the node's GPU(s) (local rank % device count). Results go to
# benchmarks/results/ddp_cuda.json and staging_cuda.json; a missing GPU is a failure,
# not a skip. Arguments go to bench_ddp.py (e.g. --steps 30).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
read -r -a MPIEXEC <<< "${MPIEXEC:-.venv/bin/mpiexec}"
export HPCDDP_TEST_GPU=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"${PY}" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"
"${MPIEXEC[@]}" -n 2 "${PY}" -m hpcddp doctor --max-bytes 16777216
# What the device-buffer self-test says of this MPI, whatever detection says.
"${PY}" -c "from hpcddp.world import device_self_test; print(device_self_test())"
timeout -k 10 300 "${PY}" -m pytest -q tests/unit
timeout -k 10 900 "${MPIEXEC[@]}" -n 2 "${PY}" -m pytest -q -p hpcddp.testing tests/mpi
# The demo, end to end on the GPU: pinned loader batches, staged or device buckets.
RUN_DIR=$(mktemp -d)
timeout -k 10 600 "${MPIEXEC[@]}" -n 2 "${PY}" examples/train_digits.py --run-dir "${RUN_DIR}"
rm -rf "${RUN_DIR}"
timeout -k 10 900 "${MPIEXEC[@]}" -n 2 "${PY}" benchmarks/bench_ddp.py --device cuda "$@"
timeout -k 10 600 "${MPIEXEC[@]}" -n 2 "${PY}" benchmarks/bench_staging.py
