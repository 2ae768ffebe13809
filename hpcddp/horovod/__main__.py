"""``python -m hpcddp.horovod install-alias | remove-alias | status``: let Horovod programs
import ``horovod`` unchanged, in this Python environment.

``install-alias`` writes ``hpcddp-horovod-alias.pth`` into the environment's
site-packages, which puts ``hpcddp/horovod/alias`` on ``sys.path`` (a path, no code run
at start-up), and a ``horovodrun`` command beside ``python``. It refuses where a real
Horovod is installed. ``remove-alias`` takes both away.
"""

import argparse
import importlib.metadata
import importlib.util
import stat
import sys
import sysconfig
from pathlib import Path

ALIAS = Path(__file__).resolve().parent / "alias"
PTH = "hpcddp-horovod-alias.pth"
SCRIPT = "horovodrun"
_MARK = "# hpcddp.horovod install-alias"


def _site() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def _script() -> Path:
    return Path(sysconfig.get_paths()["scripts"]) / SCRIPT


def _real_horovod():
    """Where a Horovod that is not this alias is installed; None where there is none."""
    try:
        dist = importlib.metadata.distribution("horovod")
        return f"the horovod {dist.version} distribution"
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec("horovod")
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    return None if ALIAS in origin.parents else str(origin.parent)


def install() -> int:
    real = _real_horovod()
    if real is not None:
        print(f"hpcddp.horovod: not installing the alias: a Horovod is installed here "
              f"({real}); `pip uninstall horovod` first, or keep using it", file=sys.stderr)
        return 1
    (_site() / PTH).write_text(f"{ALIAS}\n")
    script = _script()
    script.write_text(f"#!{sys.executable}\n{_MARK}\nimport sys\n"
                      f"from hpcddp.commands.horovodrun import main\nsys.exit(main())\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    print(f"hpcddp.horovod: `import horovod.torch as hvd` and `horovodrun` now use hpcddp in "
          f"{sys.prefix} ({_site() / PTH}, {script}); `python -m hpcddp.horovod "
          f"remove-alias` undoes it")
    return 0


def remove() -> int:
    removed = []
    pth = _site() / PTH
    if pth.exists():
        pth.unlink()
        removed.append(str(pth))
    script = _script()
    if script.exists() and _MARK in script.read_text(errors="replace"):
        script.unlink()
        removed.append(str(script))
    print(f"hpcddp.horovod: removed {', '.join(removed)}" if removed else
          "hpcddp.horovod: no alias was installed in this environment")
    return 0


def status() -> int:
    installed = (_site() / PTH).exists()
    print(f"hpcddp.horovod alias: {'installed' if installed else 'not installed'} in "
          f"{sys.prefix}")
    return 0 if installed else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpcddp.horovod",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["install-alias", "remove-alias", "status"])
    args = parser.parse_args(argv)
    return {"install-alias": install, "remove-alias": remove, "status": status}[args.action]()


if __name__ == "__main__":
    sys.exit(main())
