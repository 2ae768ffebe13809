"""A child process of a rank never joins the MPI job: an unguarded script whose spawn or
forkserver DataLoader workers import it again ends the job with one line that names the
cause and the fix, not MPICH's PMI stack; fork workers, which never run init(), work."""

import pytest

LINE = ("hpcddp: hpcddp.init() or init_process_group(\"hpcddp\") ran in a process that "
        "multiprocessing started")


@pytest.mark.parametrize("method, how", [("spawn", "hpcddp"), ("forkserver", "hpcddp"),
                                         ("spawn", "torch")])
def test_unguarded_script_with_spawned_workers_ends_with_one_line(run_job, method, how):
    job = run_job(["tests/jobs/scripts/unguarded_workers.py", method, how], n=2, timeout=120,
                  env={"HPCDDP_TIMEOUT": "20"})
    assert not job.timed_out, job.output[-3000:]
    assert job.returncode != 0
    assert f"{LINE} from rank " in job.stderr, job.stderr[-3000:]
    assert 'put the script\'s training code under `if __name__ == "__main__":`' in job.stderr
    assert "PMIU_write" not in job.stderr and "PMI_Init" not in job.stderr, job.stderr[-3000:]
    lines = [line for line in job.stderr.splitlines() if line.startswith(LINE)]
    assert lines and all(len(line) > 80 for line in lines)  # whole, one line each
    assert job.seconds < 60


def test_fork_workers_after_init_are_not_refused(run_job):
    job = run_job(["tests/jobs/scripts/unguarded_workers.py", "fork", "hpcddp"], n=2,
                  timeout=120)
    assert job.returncode == 0, job.output[-3000:]
    assert LINE not in job.stderr
    assert job.stdout.count("total=28") == 2


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_guarded_script_that_imports_every_package_runs_spawned_workers(run_job, method):
    job = run_job(["tests/jobs/scripts/guarded_workers.py", method], n=2, timeout=120,
                  env={"HPCDDP_TIMEOUT": "30"})
    assert job.returncode == 0, job.output[-3000:]
    assert LINE not in job.stderr
    assert job.stdout.count("total=28") == 2
