#!/bin/bash
# The whole GPU check in one command, sized for one run of at most 10 minutes on a GPU
# machine with no network (torch, CuPy, mpi4py there; build/cuda-mpi.tar.xz carried):
#
#   OUT=/some/dir bash testbed/gpu/gpu_check.sh       # every log and figure under $OUT
#   GPU_CHECK_REHEARSAL=1 bash testbed/gpu/gpu_check.sh   # here, without a GPU
#
# 1. the CUDA-aware Open MPI from build/cuda-mpi.tar.xz with the stock mpi4py wheel
#    (MPI4PY_MPIABI=openmpi), and ompi_info's CUDA support;
# 2. the two-process device-buffer self-test, then the raw device Iallreduce of Open MPI
#    (open-mpi/ompi#9845) in a child job, and which reduction hpcddp's auto takes;
# 3. the CUDA tests (HPCDDP_TEST_GPU=1: a skip is a failure) under mpirun -n 2 in each
#    mode, HPCDDP_REDUCE=mpi, ring, staged and auto: DDP against single-process training
#    and torch's DDP, SyncBatchNorm, comm hooks, sparse gradients, the backend; and FSDP2
#    on the GPU against single-process training, in auto;
# 4. bench_ddp --device cuda: the bare step, hpcddp in each mode and torch's DDP on gloo,
#    2 ranks sharing the GPU, in one job per mode; bench_memory --device cuda: the memory
#    DDP (with and without gradient_as_bucket_view) and a checkpoint load add, against
#    torch's.
#
# A failed step is recorded and the next one runs; $OUT/summary.txt lists every step
# with its status and seconds, and the exit status is the number of failed steps.
# GPU_CHECK_DEADLINE (seconds, default 540; none in a rehearsal) bounds the whole run: each step's limit is cut
# to what is left, and a step with less than 20 s left is recorded as SKIPPED, so that a
# device run with a fixed budget always brings back a complete summary.
# GPU_CHECK_STEPS=REGEX runs only the steps whose names match (a second run for a fix). The order puts
# what matters most first: the MPI, the self-test, the GPU DDP step with auto, the CUDA
# tests of the four modes (run side by side: they check results, not speed), then the
# DDP step in the forced modes.
# Rehearsal (no GPU): the same steps, with the carried MPI where build/cuda-mpi.tar.xz is
# there and the mpich wheel standing in where it is absent; the steps that need a GPU
# must fail, and only those (they are marked "gpu" in the summary). It adds the test and
# benchmark jobs of steps 3 and 4 on host buffers, to prove their commands here.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-check-out}
REHEARSAL=${GPU_CHECK_REHEARSAL:-0}
if [ -z "${PY:-}" ]; then  # the machine's Python; a rehearsal's default is the dev venv's
  PY=$(command -v python3)
  [ "$REHEARSAL" = 1 ] && [ -x "$ROOT/.venv/bin/python" ] && PY=$ROOT/.venv/bin/python
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH} OMP_NUM_THREADS=1 HPCDDP_NUM_THREADS=1

# step NAME NEEDS SECONDS COMMAND...: run, log to $OUT/NAME.log, record the outcome.
# NEEDS is "gpu" where only a GPU machine can pass it.
# A rehearsal has no deadline of its own: every step that needs no GPU must run.
DEADLINE=$((SECONDS + ${GPU_CHECK_DEADLINE:-$([ "$REHEARSAL" = 1 ] && echo 36000 || echo 540)}))
step() {
  local name=$1 needs=$2 limit=$3; shift 3
  local began=$SECONDS status left=$((DEADLINE - SECONDS))
  # GPU_CHECK_STEPS: a regular expression; only the steps it matches run (a rerun's fix).
  [ -n "${GPU_CHECK_STEPS:-}" ] && ! [[ $name =~ $GPU_CHECK_STEPS ]] && return 0
  if [ "$left" -lt 20 ]; then
    printf '%-28s %-4s %s\n' "$name" "$needs" "SKIPPED(deadline)" | tee -a "$SUMMARY"
    return 0
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name" >> "$OUT/gpu_check.log"
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  status=$?
  { echo "== $name"; tail -n 5 "$OUT/$name.log"; } >> "$OUT/gpu_check.log"
  printf '%-28s %-4s %s %4ds\n' "$name" "$needs" \
    "$([ $status = 0 ] && echo ok || echo "FAILED($status)")" $((SECONDS - began)) | tee -a "$SUMMARY"
  return 0
}

# -- 1. the MPI ---------------------------------------------------------------------------
# CUDA_MPI_TARBALL: the carried MPI; a rehearsal may point it at a stand-in of the same
# shape (cuda-mpi/env.sh) around a host-only Open MPI, to run the Open MPI road here.
# Unpacked outside $OUT, which holds only logs and figures (the device tool returns all
# of $OUT; 33 MB of libraries need not come back).
MPI_DIR=${GPU_CHECK_WORK:-$ROOT/build/gpu-check-work}
rm -rf "$MPI_DIR"
TARBALL=${CUDA_MPI_TARBALL:-$ROOT/build/cuda-mpi.tar.xz}
if [ -f "$TARBALL" ]; then
  mkdir -p "$MPI_DIR" && tar -C "$MPI_DIR" -xJf "$TARBALL"
  # shellcheck disable=SC1091
  source "$MPI_DIR/cuda-mpi/env.sh"
  export MPI4PY_MPIABI=openmpi
  # Without a driver (a rehearsal) Open MPI warns in every process that CUDA is off.
  [ "$REHEARSAL" = 1 ] && export OMPI_MCA_opal_warn_on_missing_libcuda=0
  # The machine's own mpi4py serves where it loads this Open MPI (4.1's stock wheel does);
  # an older one, or one built for another MPI, gives way to the wheel carried in the
  # tarball (cuda-mpi/wheels, one per Python), unpacked ahead of it on PYTHONPATH.
  tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  if ! "$PY" -c "from mpi4py import MPI; assert MPI.Get_library_version().startswith('Open MPI')" \
       > "$OUT/mpi4py_probe.log" 2>&1; then
    wheel=$(ls "$MPI_DIR"/cuda-mpi/wheels/mpi4py-*-"$tag"-*.whl 2>/dev/null | head -n 1)
    if [ -n "$wheel" ]; then
      "$PY" -m zipfile -e "$wheel" "$MPI_DIR/pylib"
      export PYTHONPATH=$MPI_DIR/pylib:$PYTHONPATH
      echo "mpi4py: this Python's does not load Open MPI ($(tail -n 1 "$OUT/mpi4py_probe.log")); using $(basename "$wheel")" | tee -a "$SUMMARY"
    else
      echo "mpi4py: this Python's does not load Open MPI and no carried wheel is for $tag" | tee -a "$SUMMARY"
    fi
  fi
  # hpcddp's own light dependencies, from the carried wheels where this Python lacks them.
  for module in xxhash tqdm; do
    "$PY" -c "import $module" 2> /dev/null && continue
    wheel=$(ls "$MPI_DIR"/cuda-mpi/wheels/"$module"-*-{"$tag",py3}-*.whl 2> /dev/null | head -n 1)
    if [ -n "$wheel" ]; then
      "$PY" -m zipfile -e "$wheel" "$MPI_DIR/pylib"
      case ":$PYTHONPATH:" in *":$MPI_DIR/pylib:"*) ;; *) export PYTHONPATH=$MPI_DIR/pylib:$PYTHONPATH ;; esac
      echo "$module: not installed here; using $(basename "$wheel")" | tee -a "$SUMMARY"
    else
      echo "$module: not installed here and no carried wheel is for $tag" | tee -a "$SUMMARY"
    fi
  done
  # mpirun passes on only what -x names; the modes' variables are set per step, so every
  # name is given a value here (an unset one draws a warning and is not passed).
  export HPCDDP_REDUCE=${HPCDDP_REDUCE:-auto} HPCDDP_TEST_GPU=${HPCDDP_TEST_GPU:-0}
  MPIRUN=(mpirun --oversubscribe --bind-to none)
  for var in PYTHONPATH MPI4PY_MPIABI LD_LIBRARY_PATH OMP_NUM_THREADS HPCDDP_NUM_THREADS \
             HPCDDP_REDUCE HPCDDP_TEST_GPU UCX_MODULE_DIR UCX_TLS; do
    [ -n "${!var+set}" ] && MPIRUN+=(-x "$var")
  done
  export HPCDDP_SELFTEST_LAUNCHER="mpirun --oversubscribe --bind-to none"
  step ompi_info any 60 bash -c 'ompi_info --parsable --all | grep -m1 mpi_built_with_cuda_support:value'
elif [ "$REHEARSAL" = 1 ]; then
  echo "rehearsal: $TARBALL absent, the mpich wheel stands in" | tee -a "$SUMMARY"
  MPIRUN=("$(dirname "$PY")/mpiexec")
else
  echo "$TARBALL is missing: run make cuda-mpi and carry it" | tee -a "$SUMMARY"
  exit 2
fi
step versions any 60 "$PY" -c "import sys, torch, mpi4py; from mpi4py import MPI
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'devices', torch.cuda.device_count(), 'mpi4py', mpi4py.__version__)
from hpcddp.startup.mpi_library import library_version_line; print(library_version_line())"
step gpu_present gpu 60 "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device')"

# -- 2. the self-test and Open MPI's device Iallreduce --------------------------------------
step self_test gpu 180 "$PY" -c "from hpcddp.runtime.world import device_self_test
v = device_self_test(); print(v.describe()); raise SystemExit(0 if v.p2p.passed else 1)"
# The raw operation, as a user's own Iallreduce on device memory would run it: expected
# to crash or be wrong on Open MPI (libnbc reduces with host code), in a job of its own.
step raw_device_iallreduce gpu 120 "$PY" -c "
from hpcddp.startup.selftest import CUPY_PAIR_SETUP, pair_launcher, run_pair_check
import os
r = run_pair_check(pair_launcher(os.environ.get('HPCDDP_SELFTEST_LAUNCHER', '')), 'iallreduce',
                   CUPY_PAIR_SETUP)
print('raw device Iallreduce:', r.reason)
print('crash or wrong result reproduced:', 'no, it passed' if r.passed else 'yes')"
step auto_avoids_it gpu 180 "${MPIRUN[@]}" -n 2 "$PY" -c "
import hpcddp, torch
w = hpcddp.init()
assert w.device.type == 'cuda', 'no GPU'
if w.is_main:
    print('auto:', w.reduction, '|', w.reduction_reason, '|', w.cuda_aware_reason)
v = w.device_verdict
assert v is None or v.iallreduce.passed or w.reduction != 'mpi', 'auto chose a failing Iallreduce'
"

# -- 3. the DDP step on the GPU with auto, what users get, on every model ---------------
bench() {  # bench MODE MODELS
  step "bench_ddp_$1" gpu 240 env HPCDDP_REDUCE=$1 "${MPIRUN[@]}" -n 2 "$PY" \
    benchmarks/bench_ddp.py --device cuda --steps 30 --models "$2" --name "ddp_cuda_$1"
  cp "benchmarks/results/ddp_cuda_$1.json" "$OUT/" 2>/dev/null
  # A rehearsal: the same job on the CPU, a few steps, its JSON under $OUT.
  [ "$REHEARSAL" = 1 ] && step "host_bench_ddp_$1" any 240 env HPCDDP_REDUCE=$1 \
    "${MPIRUN[@]}" -n 2 "$PY" benchmarks/bench_ddp.py --steps 2 --models mlp \
    --name "$OUT/host_ddp_$1"
  return 0
}
bench auto mlp,mlp_b1024,toy_cifar

# GPU_CHECK_BEFORE=CHECKOUT (its hpcddp/ and benchmarks/): the same DDP step with that
# earlier hpcddp, in the same run, for a before/after on one machine.
if [ -n "${GPU_CHECK_BEFORE:-}" ]; then
  step bench_ddp_before gpu 240 env HPCDDP_REDUCE=auto PYTHONPATH="$GPU_CHECK_BEFORE:$PYTHONPATH" \
    "${MPIRUN[@]}" -n 2 "$PY" "$GPU_CHECK_BEFORE/benchmarks/bench_ddp.py" --device cuda \
    --steps 30 --models mlp --name "$OUT/ddp_cuda_before"
fi

# -- 3b. the memory DDP adds on the GPU, and a checkpoint load's, against torch's ----------
step memory gpu 300 "$PY" benchmarks/bench_memory.py --device cuda --launcher "${MPIRUN[*]} -n" \
  --out "$OUT/memory_cuda.json"
[ "$REHEARSAL" = 1 ] && step host_memory any 300 "$PY" benchmarks/bench_memory.py \
  --launcher "${MPIRUN[*]} -n" --out "$OUT/host_memory.json"

# -- 4. the CUDA tests in every mode, side by side -------------------------------------------
CUDA_TESTS=(tests/mpi/test_ddp_vs_single.py tests/mpi/test_ddp_vs_torch.py
            tests/mpi/test_ddp_behaviour.py tests/mpi/test_syncbn.py tests/mpi/test_comm_hooks.py
            tests/mpi/test_process_group.py tests/mpi/test_world.py tests/mpi/test_ring.py)
for mode in auto mpi ring staged; do
  step "cuda_tests_$mode" gpu 240 env HPCDDP_REDUCE=$mode HPCDDP_TEST_GPU=1 \
    "${MPIRUN[@]}" -n 2 "$PY" -m pytest -q -p no:cacheprovider -p hpcddp.testing -k "cuda or gpu or sparse" \
    "${CUDA_TESTS[@]}" &
done
# FSDP2 on device tensors (its own streams, all-gathers and reduce-scatters) against
# single-process training on the same GPU, with what users get (auto).
step fsdp2_cuda gpu 240 env HPCDDP_REDUCE=auto HPCDDP_TEST_GPU=1 "${MPIRUN[@]}" -n 2 "$PY" \
  -m pytest -q -p no:cacheprovider -p hpcddp.testing -k "on_device" \
  tests/mpi/parallel/test_fsdp.py &
wait
# A rehearsal also runs the same files, launcher and modes on host buffers (the GPU cases
# skip), so that the command itself is proven before a GPU run.
if [ "$REHEARSAL" = 1 ]; then
  for mode in auto mpi ring staged; do
    step "host_tests_$mode" any 240 env HPCDDP_REDUCE=$mode HPCDDP_TEST_GPU=0 \
      "${MPIRUN[@]}" -n 2 "$PY" -m pytest -q -x -p no:cacheprovider -p hpcddp.testing "${CUDA_TESTS[@]}"
  done
  step host_fsdp2 any 240 env HPCDDP_REDUCE=auto HPCDDP_TEST_GPU=0 "${MPIRUN[@]}" -n 2 "$PY" \
    -m pytest -q -p no:cacheprovider -p hpcddp.testing -k "on_device" \
    tests/mpi/parallel/test_fsdp.py
fi

# -- 5. the DDP step on the GPU in the forced modes, on the MLP (the target's model) -------
for mode in mpi ring staged; do
  bench "$mode" mlp
done

FAILED=$(grep -c -E ' (FAILED|SKIPPED)' "$SUMMARY")
echo "failed steps: $FAILED" | tee -a "$SUMMARY"
exit "$FAILED"
