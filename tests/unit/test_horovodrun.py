"""``horovodrun``'s command line turned into the MPI launcher's (``launch_command``, a pure
function of the arguments, the environment and the launcher found), for each launcher
Horovod's users have: hydra's ``mpiexec``, Open MPI's ``mpirun``, and ``srun`` inside a
Slurm allocation. A real ``horovodrun -np 2`` job runs in tests/jobs/test_horovod_alias.py.
"""

import pytest

from hpcddp.commands.horovodrun import _parser, launch_command

HYDRA = ("/opt/mpich/bin/mpiexec", "hydra")
OPENMPI = ("/opt/ompi/bin/mpirun", "openmpi")


def _command(argv, environ=None, launcher=HYDRA):
    return launch_command(_parser().parse_args(argv), environ or {}, launcher)


def test_hosts_and_tuning_flags_under_hydra():
    command, settings = _command(["-np", "4", "-H", "a:2,b:2", "--fusion-threshold-mb", "32",
                                  "--cycle-time-ms", "3.5", "--timeline-filename", "t.json",
                                  "python", "train.py", "--lr", "0.1"])
    assert command == ["/opt/mpich/bin/mpiexec", "-n", "4", "-hosts", "a:2,b:2", "python",
                       "train.py", "--lr", "0.1"]
    assert settings == {"HOROVOD_FUSION_THRESHOLD": str(32 * 1024 * 1024),
                        "HOROVOD_CYCLE_TIME": "3.5", "HOROVOD_TIMELINE": "t.json"}


def test_open_mpi_gets_hosts_and_exports_each_setting():
    command, settings = _command(["-np", "2", "-H", "a:1,b:1", "--autotune",
                                  "--mpi-args=--bind-to none", "python", "t.py"],
                                 launcher=OPENMPI)
    assert command == ["/opt/ompi/bin/mpirun", "-n", "2", "--host", "a:1,b:1", "-x",
                       "HOROVOD_AUTOTUNE", "--bind-to", "none", "python", "t.py"]
    assert settings == {"HOROVOD_AUTOTUNE": "1"}


def test_a_hostfile_is_read_as_hosts_and_slots(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# the nodes\nnode1 slots=4\nnode2 slots=2  # half\n\nnode3\n")
    command, _ = _command(["-np", "7", "--hostfile", str(hostfile), "python", "t.py"])
    assert command[3:5] == ["-hosts", "node1:4,node2:2,node3:1"]
    (tmp_path / "empty").write_text("# none\n")
    with pytest.raises(SystemExit, match="names no host"):
        _command(["-np", "1", "--hostfile", str(tmp_path / "empty"), "python", "t.py"])


def test_inside_a_slurm_allocation_without_hosts_srun_starts_the_ranks():
    command, settings = _command(["-np", "8", "--no-stall-check", "python", "t.py"],
                                 environ={"SLURM_JOB_ID": "42"})
    assert command == ["srun", "-n", "8", "--kill-on-bad-exit=1", "python", "t.py"]
    assert settings == {"HOROVOD_STALL_CHECK_DISABLE": "1"}
    command, _ = _command(["-np", "2", "python", "t.py"],
                          environ={"SLURM_JOB_ID": "42", "HPCDDP_SRUN_MPI": "pmix"})
    assert command == ["srun", "-n", "2", "--kill-on-bad-exit=1", "--mpi=pmix", "python",
                       "t.py"]
    # Hosts given: the user's choice of nodes, through MPI's launcher.
    command, _ = _command(["-np", "2", "-H", "a:2", "python", "t.py"],
                          environ={"SLURM_JOB_ID": "42"})
    assert command[0] == HYDRA[0]


def test_flags_for_horovods_own_ssh_start_up_are_accepted_and_do_nothing():
    command, settings = _command(["-np", "2", "-p", "2222", "-i", "key", "--start-timeout",
                                  "30", "python", "t.py"])
    assert command == [HYDRA[0], "-n", "2", "python", "t.py"] and settings == {}


@pytest.mark.parametrize("flags, said", [
    (["--gloo"], "--gloo is not supported: hpcddp runs on MPI only"),
    (["--jsrun"], "--jsrun is not supported"),
    (["--min-np", "2"], "--min-np is not supported: elastic Horovod"),
    (["--host-discovery-script", "d.sh"], "--host-discovery-script is not supported"),
    (["--mpi-threads-disable"], "MPI_THREAD_SERIALIZED"),
    (["--output-filename", "out"], "--output-filename is not supported"),
])
def test_what_hpcddp_does_not_do_is_refused_with_the_reason(flags, said):
    with pytest.raises(SystemExit, match=said):
        _command(["-np", "2", *flags, "python", "t.py"])


def test_no_command_or_no_np_is_an_error():
    with pytest.raises(SystemExit, match="give the command to run"):
        _command(["-np", "2"])
    with pytest.raises(SystemExit):
        _parser().parse_args(["python", "t.py"])  # -np is required, as in Horovod


def test_horovodrun_starts_no_mpi_of_its_own():
    # It execs the launcher: MPI started here would never be finalized, leaving its
    # shared-memory segment in /dev/shm at every run.
    import subprocess
    import sys

    seen = subprocess.run([sys.executable, "-c", "import sys, hpcddp.commands.horovodrun; "
                           "print(sorted(m for m in sys.modules if m.startswith('mpi4py')))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    assert seen == "[]", seen
