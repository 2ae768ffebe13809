"""torchrun's variables from MPI's facts (``hpcddp.env.torchrun``), and their place among
the variables a child process must not inherit."""

from hpcddp.env import clean_environment
from hpcddp.env.torchrun import TORCHRUN_VARIABLES, disagreements, export, torchrun_values


def test_values_are_torchruns_for_one_agent_per_node():
    # Rank 5 of 8, the second of 4 ranks on the second of 2 nodes.
    values = torchrun_values(5, 8, 1, 4, 1, 2)
    assert values == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                      "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
                      "ROLE_RANK": "5", "ROLE_WORLD_SIZE": "8"}
    assert set(values) == set(TORCHRUN_VARIABLES)


def test_export_sets_only_what_is_missing():
    environ = {"LOCAL_RANK": "1", "PATH": "/bin"}
    values = torchrun_values(5, 8, 1, 4, 1, 2)
    assert disagreements(values, environ) == []
    assert sorted(export(values, environ)) == sorted(set(TORCHRUN_VARIABLES) - {"LOCAL_RANK"})
    assert environ["RANK"] == "5" and environ["PATH"] == "/bin"


def test_a_value_mpi_contradicts_is_named_with_both_values():
    environ = {"RANK": "0", "WORLD_SIZE": "8"}
    said = disagreements(torchrun_values(5, 8, 1, 4, 1, 2), environ)
    assert said == ["RANK=0 (set before hpcddp.init()) where MPI gives 5"]


def test_child_processes_do_not_inherit_them():
    environ = dict(torchrun_values(5, 8, 1, 4, 1, 2), OMPI_MCA_btl="self,tcp", HOME="/root")
    assert clean_environment(environ) == {"OMPI_MCA_btl": "self,tcp", "HOME": "/root"}
