#!/usr/bin/env bash
# `make cuda-mpi`: a CUDA-aware Open MPI, built on a machine without a GPU, small enough
# to carry to one (the device tool carries 64 MiB).
#
# Ingredients: Debian's Open MPI 4.1.4 source (a deb-src entry is added), UCX built with
# CUDA from PyPI (libucx-cu13), and the CUDA toolkit at CUDA_HOME. Open MPI's CUDA
# support (--with-cuda) and UCX's cuda transports give device buffers to point-to-point
# and to the blocking collectives; Open MPI's non-blocking collectives (libnbc) still
# reduce on the host, which is the crash hpcddp's selection has to avoid
# (open-mpi/ompi#9845, #12045).
#
# Result, under build/cuda-mpi/: openmpi/ (the install, stripped), ucx/ (the libraries
# Open MPI loads), wheels/ (mpi4py, xxhash, tqdm for Python 3.11 and 3.12), env.sh (source it: PATH,
# OPAL_PREFIX, LD_LIBRARY_PATH for wherever the folder ends up), and
# build/cuda-mpi.tar.xz to carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=$ROOT/build/cuda-mpi
WORK=$ROOT/build/cuda-mpi-work
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PY=${PY:-$ROOT/.venv/bin/python}
JOBS=${JOBS:-$(nproc)}

test -x "$CUDA_HOME/bin/nvcc" || { echo "cuda-mpi: no CUDA toolkit at $CUDA_HOME (set CUDA_HOME)" >&2; exit 2; }
mkdir -p "$WORK" "$OUT"

# 1. Open MPI's source from Debian.
if [ ! -d "$WORK/openmpi-4.1.4" ]; then
  if ! apt-cache showsrc openmpi >/dev/null 2>&1 || [ -z "$(apt-cache showsrc openmpi 2>/dev/null)" ]; then
    printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      > /etc/apt/sources.list.d/hpcddp-deb-src.sources
    apt-get update -qq
  fi
  (cd "$WORK" && apt-get source --download-only -qq openmpi && tar xf openmpi_4.1.4.orig.tar.xz)
fi

# 2. UCX with CUDA from PyPI: headers and libraries, unpacked from the wheel.
if [ ! -d "$WORK/ucx" ]; then
  "$PY" -m pip download -q --no-deps -d "$WORK/wheel" libucx-cu13
  rm -rf "$WORK/ucxwheel" && mkdir -p "$WORK/ucxwheel"
  (cd "$WORK/ucxwheel" && "$PY" -m zipfile -e "$WORK"/wheel/libucx_cu13-*.whl .)
  mkdir -p "$WORK/ucx"
  cp -r "$WORK/ucxwheel/libucx/include" "$WORK/ucx/"
  mkdir -p "$WORK/ucx/lib/ucx"
  # The wheel stores each library three times (no symlinks in a zip): keep one and link.
  for lib in ucp ucs uct ucm ucs_signal; do
    cp "$WORK/ucxwheel/libucx/lib/lib$lib.so.0" "$WORK/ucx/lib/"
    ln -sf "lib$lib.so.0" "$WORK/ucx/lib/lib$lib.so"
  done
  for mod in "$WORK"/ucxwheel/libucx/lib/ucx/libuct_*.so.0 "$WORK"/ucxwheel/libucx/lib/ucx/libucm_*.so.0; do
    [ -e "$mod" ] || continue
    cp "$mod" "$WORK/ucx/lib/ucx/"
    ln -sf "$(basename "$mod")" "$WORK/ucx/lib/ucx/$(basename "$mod" .0)"
  done
  cp "$WORK"/ucxwheel/libucx_cu13.libs/*.so* "$WORK/ucx/lib/"
fi

# 3. Open MPI with CUDA and UCX, without what a GPU node's test does not use.
if [ ! -x "$OUT/openmpi/bin/mpicc" ]; then
  cd "$WORK/openmpi-4.1.4"
  ./configure -q --prefix="$OUT/openmpi" --with-cuda="$CUDA_HOME" --with-ucx="$WORK/ucx" \
    --disable-mpi-fortran --disable-oshmem --disable-mpi-java \
    --without-verbs --without-ofi --without-psm2 --without-hcoll --without-cma \
    --enable-mca-no-build=btl-uct,btl-openib,coll-hcoll,coll-fca > "$WORK/configure.log"
  make -s -j"$JOBS" > "$WORK/make.log" 2>&1
  make -s install > "$WORK/install.log" 2>&1
  cd "$ROOT"
  find "$OUT/openmpi" -name "*.la" -delete
  rm -rf "$OUT/openmpi/share/doc" "$OUT/openmpi/share/man"
  find "$OUT/openmpi" -type f \( -name "*.so*" -o -perm -u+x \) -exec strip --strip-unneeded {} + 2>/dev/null || true
fi
rm -rf "$OUT/ucx" && cp -a "$WORK/ucx" "$OUT/ucx" && rm -rf "$OUT/ucx/include"

# 4. An environment file that works wherever the folder is carried.
cat > "$OUT/env.sh" <<'ENV'
# source build/cuda-mpi/env.sh: use the CUDA-aware Open MPI from this folder.
CUDA_MPI=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$CUDA_MPI/openmpi
export PATH=$CUDA_MPI/openmpi/bin:$PATH
export LD_LIBRARY_PATH=$CUDA_MPI/openmpi/lib:$CUDA_MPI/ucx/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$CUDA_MPI/ucx/lib/ucx
export OMPI_MCA_pml=ucx OMPI_MCA_osc=ucx
# Open MPI 4.1 takes UCX only where it sees InfiniBand or cuda_ipc (pml_ucx_tls,
# pml_ucx_devices); on one node without them (shared memory, tcp, cuda_copy) UCX would
# be refused and, with pml=ucx, MPI_Init would fail.
export OMPI_MCA_pml_ucx_tls=any OMPI_MCA_pml_ucx_devices=any
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export MPI4PY_MPIABI=openmpi
ENV

# 5. No mpi4py build: the stock mpi4py 4.1 wheel carries an Open MPI variant, picked at
# import by MPI4PY_MPIABI=openmpi (env.sh sets it) with this libmpi.so.40 on the path.
# Its wheels ride along (1.3 MB each), for a GPU machine whose mpi4py is older or built
# for another MPI: this venv's version, for this Python and the GPU image's 3.12.
MPI4PY_VERSION=$("$PY" -c 'import mpi4py; print(mpi4py.__version__)')
rm -rf "$OUT/wheels"
for pyver in 3.11 3.12; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 -d "$OUT/wheels" \
    "mpi4py==$MPI4PY_VERSION"
  # hpcddp's two light dependencies that a GPU image may lack (checkpoints, packing).
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_5_x86_64 -d "$OUT/wheels" \
    "xxhash==$("$PY" -c 'import xxhash; print(xxhash.VERSION)')" \
    "tqdm==$("$PY" -c 'import tqdm; print(tqdm.__version__)')"
done

# 6. Proof, and the size to carry.
(source "$OUT/env.sh" && ompi_info --parsable --all | grep -m1 "mpi_built_with_cuda_support:value")
tar -C "$ROOT/build" -cJf "$ROOT/build/cuda-mpi.tar.xz" cuda-mpi
du -sh "$OUT" "$ROOT/build/cuda-mpi.tar.xz"
