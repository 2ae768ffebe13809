"""Doctor's cross-rank consistency check."""

from hpcddp.commands.doctor import find_advice, find_problems


def _report(rank, **changes):
    report = {"rank": rank, "hpcddp": "0.1.0", "torch": "2.13.0", "mpi4py": "4.1.2",
              "mpi_library": "MPICH Version: 5.0.2", "python": "3.11.7"}
    report.update(changes)
    return report


def test_agreeing_ranks_have_no_problem():
    assert find_problems([_report(r) for r in range(4)]) == []


def test_version_mismatch_names_field_values_and_ranks():
    reports = [_report(0), _report(1), _report(2, torch="2.12.0"), _report(3, torch="2.12.0")]
    (problem,) = find_problems(reports)
    assert "torch" in problem and "2.12.0 on ranks 2,3" in problem
    assert "2.13.0 on ranks 0,1" in problem


def _seen(rank, library="MPICH Version: 5.0.2", device="cpu", aware=False):
    return _report(rank, mpi_library=library, device=device, cuda_aware=aware,
                   cuda_aware_reason="MPIX_Query_cuda_support() = 0")


def test_open_mpi_4_on_few_ranks_is_told_about_the_ring():
    ompi = "Open MPI v4.1.6"
    (note,) = find_advice([_seen(r, ompi) for r in range(2)], environ={})
    assert "OMPI_MCA_coll_libnbc_iallreduce_algorithm=1" in note
    set_already = {"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "1"}
    assert find_advice([_seen(r, ompi) for r in range(2)], environ=set_already) == []
    assert find_advice([_seen(r, ompi) for r in range(4)], environ={}) == []
    assert find_advice([_seen(r, "Open MPI v5.0.8") for r in range(2)], environ={}) == []
    assert find_advice([_seen(r) for r in range(2)], environ={}) == []


def test_open_mpi_5_across_nodes_is_told_about_the_ring():
    ompi = "Open MPI v5.0.11"
    across = [dict(_seen(r, ompi), host=f"node{r}") for r in range(2)]
    (note,) = find_advice(across, environ={})
    assert "OMPI_MCA_coll_libnbc_iallreduce_algorithm=1" in note and "0.48" in note
    assert find_advice(across, environ={"OMPI_MCA_coll_libnbc_iallreduce_algorithm": "1"}) == []
    one_node = [dict(_seen(r, ompi), host="node0") for r in range(2)]
    assert find_advice(one_node, environ={}) == []
    mpich = [dict(_seen(r), host=f"node{r}") for r in range(2)]
    assert find_advice(mpich, environ={}) == []


def test_gpu_ranks_without_cuda_aware_mpi_are_told_they_stage():
    reports = [_seen(0, device="cuda:0"), _seen(1, device="cuda:1")]
    (note,) = find_advice(reports, environ={})
    assert "ranks 0,1" in note and "staged through pinned host memory" in note
    assert "MPIX_Query_cuda_support() = 0" in note
    aware = [_seen(r, device=f"cuda:{r}", aware=True) for r in range(2)]
    assert find_advice(aware, environ={}) == []


def test_mpich_on_ucx_over_tcp_across_nodes_is_told_about_ofi():
    def seen(rank, host, module="ucx", rdma=0):
        return dict(_seen(rank), host=host, network_module=module, rdma_devices=rdma)
    (note,) = find_advice([seen(0, "a"), seen(1, "b")], environ={})
    assert "MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp" in note and "no RDMA device on a, b" in note
    assert find_advice([seen(0, "a"), seen(1, "a")], environ={}) == []  # one node
    assert find_advice([seen(0, "a", "ofi"), seen(1, "b", "ofi")], environ={}) == []
    assert find_advice([seen(0, "a", rdma=2), seen(1, "b", rdma=2)], environ={}) == []
