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

.PHONY: venv demo test test-unit test-mpi clean

$(STAMP): setup.cfg pyproject.toml constraints-dev.txt
	test -x $(PY) || $(PYTHON3) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints-dev.txt -e '.[mpich,test,demo]'
	touch $@

venv: $(STAMP)

demo: venv
	$(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m hpcddp doctor

test: test-unit test-mpi

test-unit: venv
	$(PYTEST) tests/unit tests/jobs

test-mpi: venv
	$(MPI_TIMEOUT) $(MPIEXEC) -n 2 $(PY) -m pytest -p hpcddp.testing tests/mpi
	$(MPI_TIMEOUT) $(MPIEXEC) -n 3 $(PY) -m pytest -p hpcddp.testing tests/mpi

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
