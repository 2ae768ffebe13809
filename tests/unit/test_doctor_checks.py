"""Doctor's cross-rank consistency check."""

from hpcddp.doctor import find_problems


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
    assert "torch" in problem and "2.12.0 on ranks 2,3" in problem and "2.13.0 on ranks 0,1" in problem
