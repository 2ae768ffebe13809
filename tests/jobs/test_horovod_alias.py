"""``python -m hpcddp.horovod install-alias`` in a fresh virtual environment: a Horovod
program then runs unchanged through ``horovodrun``, trains as one process on the global
batch would, and ``remove-alias`` leaves nothing behind. A real Horovod in the
environment keeps the alias out.

The environment is made by ``python -m venv`` and sees this one's packages (torch, MPI,
hpcddp) through a ``.pth`` line; the alias's files go into its own site-packages and bin.
"""

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from jobs_util import BIN, ROOT, run_command

SCRIPT = ROOT / "tests/jobs/scripts/horovod_train.py"


@pytest.fixture
def venv(tmp_path):
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], check=True, text=True,
                               capture_output=True).stdout.strip())
    ours = sysconfig.get_paths()["purelib"]
    (site / "see-the-dev-env.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    return python, site


def _run(command, **env):
    # This environment's bin on PATH: the MPI launcher horovodrun finds; its lib, where
    # the MPI wheel's library is found by the prefix a fresh environment does not share.
    lib = os.pathsep.join(filter(None, [str(BIN.parent / "lib"),
                                        os.environ.get("LD_LIBRARY_PATH")]))
    return run_command([str(c) for c in command], timeout=180,
                       env=dict(PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
                                LD_LIBRARY_PATH=lib, **env))


def test_the_alias_runs_a_horovod_program_through_horovodrun_and_goes_away(venv):
    python, site = venv
    assert _run([python, "-c", "import horovod"]).returncode != 0  # no Horovod here
    done = _run([python, "-m", "hpcddp.horovod", "install-alias"])
    assert done.returncode == 0, done.output
    horovodrun = python.parent / "horovodrun"
    assert (site / "hpcddp-horovod-alias.pth").exists() and horovodrun.exists()
    job = _run([horovodrun, "-np", "2", "--fusion-threshold-mb", "1", python, SCRIPT])
    assert job.returncode == 0, job.output
    lines = sorted(line for line in job.stdout.splitlines() if line.startswith("rank "))
    assert len(lines) == 2, job.output
    for rank, line in enumerate(lines):
        assert line.startswith(f"rank {rank} of 2: horovod 0.28.1+hpcddp."), job.output
        assert line.endswith("agrees with one process on the global batch, fusion "
                             "threshold 1048576"), job.output
    gone = _run([python, "-m", "hpcddp.horovod", "remove-alias"])
    assert gone.returncode == 0, gone.output
    assert not (site / "hpcddp-horovod-alias.pth").exists() and not horovodrun.exists()
    assert _run([python, "-c", "import horovod"]).returncode != 0
    assert _run([python, "-m", "hpcddp.horovod", "status"]).returncode == 1


def test_a_real_horovod_keeps_the_alias_out(venv):
    python, site = venv
    # What `pip install horovod` leaves: its distribution's metadata.
    meta = site / "horovod-0.28.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: horovod\nVersion: 0.28.1\n")
    done = _run([python, "-m", "hpcddp.horovod", "install-alias"])
    assert done.returncode == 1
    assert "a Horovod is installed here (the horovod 0.28.1 distribution)" in done.stderr
    assert not (site / "hpcddp-horovod-alias.pth").exists()
    assert not (python.parent / "horovodrun").exists()
