"""The network module hpcddp chooses for the mpich wheel before MPI_Init
(hpcddp.env.netmod): the user's choice and other MPIs win, the wheel gets ofi."""

import os
import subprocess
import sys

import pytest

from hpcddp.env.netmod import NETMOD_VARIABLES, choose_netmod, device_line, wheel_libmpi

WHEEL = "/venv/lib/libmpi.so.12"


def test_the_wheel_whose_default_is_ucx_gets_ofi():
    assert choose_netmod({}, WHEEL, "ch4:ucx ofi").value == "ofi"
    assert choose_netmod({}, WHEEL, "ch4:ucx,ofi").value == "ofi"


@pytest.mark.parametrize("name", NETMOD_VARIABLES)
def test_the_users_choice_wins_under_any_of_mpichs_names(name):
    choice = choose_netmod({name: "ucx"}, WHEEL, "ch4:ucx ofi")
    assert choice.value is None and f"{name}=ucx set by the user" in choice.reason


@pytest.mark.parametrize("environ, why", [
    ({"MPI4PY_LIBMPI": "/opt/site/lib/libmpi.so"}, "MPI4PY_LIBMPI set"),
    ({"MPI4PY_MPIABI": "openmpi"}, "MPI4PY_MPIABI set"),
    ({"LD_PRELOAD": "/opt/cray/lib/libmpi_cray.so"}, "LD_PRELOAD"),
])
def test_another_library_mpi4py_may_load_keeps_its_own_default(environ, why):
    choice = choose_netmod(environ, WHEEL, "ch4:ucx ofi")
    assert choice.value is None and why in choice.reason


@pytest.mark.parametrize("device", ["ch4:ofi", "ch4:ucx", "ch3:nemesis", ""])
def test_a_wheel_built_otherwise_keeps_its_default(device):
    assert choose_netmod({}, WHEEL, device).value is None


def test_no_wheel_no_choice():
    assert choose_netmod({}, None, "").value is None


def test_the_wheel_of_this_environment_is_found_and_read_without_starting_mpi():
    # The mpich wheel is what `make demo` installs; under another flavour's venv it is not.
    path = wheel_libmpi()
    try:
        from importlib.metadata import distribution
        distribution("mpich")
    except Exception:  # noqa: BLE001
        assert path is None
        return
    assert path == os.path.realpath(os.path.join(sys.exec_prefix, "lib", "libmpi.so.12"))
    assert device_line(path).startswith("ch4:")
    # Read in a process of its own that then starts nothing: MPI is not initialized.
    code = ("import mpi4py; mpi4py.rc(initialize=False)\n"
            "from hpcddp.env.netmod import device_line, wheel_libmpi\n"
            "print(device_line(wheel_libmpi()))\n"
            "from mpi4py import MPI; print(MPI.Is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out[-1] == "False" and out[0].startswith("ch4:")
