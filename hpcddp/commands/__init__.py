"""Every ``hpcddp`` command, and the dispatcher that runs one: ``hpcddp COMMAND`` (or
``python -m hpcddp COMMAND``). Each command is a module here with a ``main(argv)``;
``parser.py`` is the argument parser they share.

Exit status: 0 on success, 1 when a command finds a problem, 2 for a usage error (no
command, an unknown one, bad arguments), as argparse does.
"""

import sys

from hpcddp.version import __version__

__all__ = ["main"]

_COMMANDS = {
    "doctor": ("hpcddp.commands.doctor",
               "check the MPI/torch set-up on every rank and measure MPI"),
    "horovodrun": ("hpcddp.commands.horovodrun", "Horovod's launcher command line, run by "
                   "MPI's launcher or srun (also `horovodrun` after install-alias)"),
    "lost": ("hpcddp.commands.lost",
             "after a failed job: the node it lost, from the launcher's log and hpcddp's reports"),
    "pack": ("hpcddp.commands.pack", "write .npy/.npz arrays into an HDF5 file for ShardedLoader"),
    "predict": ("hpcddp.commands.predict", "predict a DDP step and its scaling on a layout, from a "
                "model of links and buckets"),
    "timeline": ("hpcddp.commands.timeline", "draw steps of an HPCDDP_TIMELINE trace and measure "
                 "how much reduction overlaps backward"),
}


def _usage() -> str:
    lines = ["usage: hpcddp [--version] [-h] COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:10} {summary}" for name, (_, summary) in _COMMANDS.items()]
    return "\n".join(lines + ["", "hpcddp COMMAND --help says more about each."])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv and argv[0] == "--version":
        print(f"hpcddp {__version__}")
        return 0
    if not argv or argv[0] not in _COMMANDS:
        problem = (f"unknown command {argv[0]!r}" if argv else "no command given")
        print(f"{_usage()}\n\nhpcddp: error: {problem}; choose one of "
              f"{', '.join(_COMMANDS)}", file=sys.stderr)
        return 2
    import importlib
    module = importlib.import_module(_COMMANDS[argv[0]][0])
    return module.main(argv[1:])

