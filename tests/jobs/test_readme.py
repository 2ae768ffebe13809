"""Code blocks of the README and the docs marked ``<!-- readme-test -->`` run as a user would
run them.

The stated substitution is the README's own: ``.venv`` is active (its ``bin`` first on
PATH), and the marked Python block before a shell block in the same page is saved as
``train.py``, which the shell block runs. Blocks run from a folder that holds ``train.py``
and the checkout's ``examples/``, so nothing is written into the checkout.
"""

import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from jobs_util import BIN, ROOT, run_command

MARK = "<!-- readme-test"
BLOCK = re.compile(r"^(<!-- readme-test[^\n]*-->\n)?```(\w+)\n(.*?)^```", re.M | re.S)


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def marked_blocks():
    """``[(language, text, "page:line")]`` of the marked blocks, page by page, in order."""
    blocks = []
    for page in PAGES:
        text = page.read_text()
        blocks += [(m.group(2), m.group(3),
                    f"{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}")
                   for m in BLOCK.finditer(text) if m.group(1)]
    return blocks


def test_the_marked_blocks_are_the_quick_start_tutorial_and_doctor():
    blocks = marked_blocks()
    assert sum(page.read_text().count(MARK) for page in PAGES) == len(blocks)  # none mis-marked
    shells = "\n".join(text for language, text, _ in blocks if language == "sh")
    assert blocks[0][0] == "python" and "hpcddp.init()" in blocks[0][1]
    for command in ("python train.py", "python examples/ddp_tutorial.py", "hpcddp doctor"):
        assert command in shells


@pytest.mark.parametrize("index", [i for i, (language, _, _) in enumerate(marked_blocks())
                                   if language == "sh"])
def test_a_shell_block_runs_as_written(index, tmp_path):
    blocks = marked_blocks()
    language, script, where = blocks[index]
    page = where.split(":")[0]
    python = [text for lang, text, at in blocks[:index]
              if lang == "python" and at.split(":")[0] == page]
    if python:
        (tmp_path / "train.py").write_text(python[-1])
    os.symlink(ROOT / "examples", tmp_path / "examples")
    env = {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "VIRTUAL_ENV": str(BIN.parent), "OMP_NUM_THREADS": "1"}
    job = run_command(["bash", "-euo", "pipefail", "-c", script], env=env, timeout=300,
                      cwd=tmp_path)
    assert job.returncode == 0, f"{where}:\n{script}\n{job.output[-3000:]}"
    assert not job.timed_out


def test_the_readmes_links_lead_to_files_in_the_checkout():
    # The docs' own links are checked by `make docs` (MkDocs, --strict); the README's here.
    links = re.findall(r"\]\(([^)\s]+)\)", (ROOT / "README.md").read_text())
    local = [link.split("#")[0] for link in links if "://" not in link and link[0] != "#"]
    assert local, "the README links to the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_the_readmes_install_line_installs_every_module_from_a_clone(tmp_path):
    # The README's Slurm block installs hpcddp with the line after mpi4py's (mpi4py itself
    # is built against the site's MPI there, so it and the other requirements are left
    # out here: --no-deps). Run in a copy of the checkout, as a user's clone, into a fresh
    # environment: the installed package holds every module the checkout has.
    text = (ROOT / "README.md").read_text()
    slurm = text[text.index("## On a Slurm cluster"):]
    block = BLOCK.search(slurm).group(3)
    lines = [line for line in block.splitlines() if line.startswith("pip install")]
    assert lines, f"no install line in the README's Slurm block:\n{block}"
    clone = tmp_path / "clone"
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "build", "*.egg-info", "__pycache__", ".pytest_cache"))
    venv = tmp_path / "venv"
    assert run_command([sys.executable, "-m", "venv", "--without-pip", str(venv)]).returncode == 0
    pip = f"{BIN / 'python'} -m pip --python {venv / 'bin' / 'python'}"
    for line in lines:
        job = run_command(["bash", "-euo", "pipefail", "-c",
                           line.replace("pip install", f"{pip} install --no-deps", 1)],
                          cwd=clone, timeout=300)
        assert job.returncode == 0, f"README: {line}\n{job.output[-3000:]}"
    site = run_command([str(venv / "bin" / "python"), "-c",
                        "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    installed = Path(site.output.strip().splitlines()[-1]) / "hpcddp"
    modules = sorted(str(p.relative_to(ROOT / "hpcddp")) for p in (ROOT / "hpcddp").rglob("*.py"))
    assert sorted(str(p.relative_to(installed)) for p in installed.rglob("*.py")) == modules
