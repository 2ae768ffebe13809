"""Importing hpcddp starts nothing: checked in fresh interpreters."""

import json
import subprocess
import sys

import pytest

HEAVY = ("mpi4py.MPI", "h5py", "torch")


def _loaded_after(statement):
    code = (f"import json, sys\n{statement}\n"
            f"print(json.dumps([m for m in {list(HEAVY)!r} if m in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("statement, allowed", [
    ("import hpcddp", {"torch"}),
    ("import hpcddp.env", set()),
    ("import hpcddp.comm", set()),
    ("import hpcddp.data", {"torch"}),
    ("from hpcddp.env import get_setting, detect_launcher, clean_environment", set()),
])
def test_import_loads_neither_mpi_nor_h5py(statement, allowed):
    loaded = set(_loaded_after(statement))
    assert not loaded - allowed, f"{statement!r} loaded {sorted(loaded - allowed)}"


def test_import_hpcddp_loads_not_even_torch():
    assert _loaded_after("import hpcddp, hpcddp.env, hpcddp.comm, hpcddp.data") == []


def test_public_names_load_on_first_use():
    loaded = _loaded_after("import hpcddp\nhpcddp.DistributedDataParallel\nhpcddp.__version__")
    assert "torch" in loaded and "mpi4py.MPI" in loaded, "the name must really load"
    assert _loaded_after("from hpcddp.data import H5Dataset") == ["torch"]


def test_unknown_name_is_an_attribute_error():
    import hpcddp
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        hpcddp.nonsense


@pytest.mark.parametrize("statement", [
    "import hpcddp\nimport torch.distributed as dist",
    "import torch.distributed as dist\nimport hpcddp",
    "import hpcddp\nfrom torch.distributed import init_process_group as ipg\n"
    "import torch.distributed as dist",
])
def test_the_backend_is_registered_whichever_is_imported_first(statement):
    """`import hpcddp` registers "hpcddp" with torch.distributed, starting no MPI."""
    code = (f"{statement}\nimport sys\nprint(hasattr(dist.Backend, 'HPCDDP'), "
            f"'mpi4py.MPI' in sys.modules, dist.init_process_group.__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    registered, mpi, where = done.stdout.split()
    assert (registered, mpi) == ("True", "False"), done.stdout
    assert where == "torch.distributed.distributed_c10d"  # functools.wraps keeps torch's


def test_backend_names():
    from hpcddp.backend.torch_init import names_hpcddp

    assert names_hpcddp("hpcddp") and names_hpcddp("HPCDDP")
    assert names_hpcddp("cpu:hpcddp,cuda:hpcddp")
    assert not names_hpcddp("cpu:gloo,cuda:hpcddp") and not names_hpcddp("gloo")
    assert not names_hpcddp(None) and not names_hpcddp("undefined")


_STARTS_MPI = """
import builtins, json, sys
import mpi4py
mpi4py.rc.initialize = mpi4py.rc.finalize = False  # loaded, not started: no singleton
import hpcddp.startup.mpi_init as mpi_init
started, first = [], []
real = mpi_init.start_mpi
mpi_init.start_mpi = lambda *a, **k: (started.append(1), real(*a, **k))[1]
plain = builtins.__import__
def watch(name, globals=None, locals=None, fromlist=(), level=0):
    if not first and "mpi4py.MPI" not in sys.modules and (
            name == "mpi4py.MPI" or (name == "mpi4py" and "MPI" in (fromlist or ()))):
        first.append(bool(started))
    return plain(name, globals, locals, fromlist, level)
builtins.__import__ = watch
import {module}
print(json.dumps(first))
"""


@pytest.mark.parametrize("module", ["hpcddp.ddp", "hpcddp.checkpoint", "hpcddp.elastic",
                                    "hpcddp.horovod", "hpcddp.data.loader"])
def test_a_public_package_starts_mpi_the_way_hpcddp_does(module):
    # Its first import of mpi4py.MPI comes after hpcddp.startup.mpi_init.start_mpi (the
    # network module, the bounded MPI_Init, ULFM's finalize), whichever is imported first.
    done = subprocess.run([sys.executable, "-c", _STARTS_MPI.replace("{module}", module)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True], module
