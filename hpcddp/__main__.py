"""Command line: ``python -m hpcddp doctor|pack`` (also installed as ``hpcddp``)."""

import sys

_COMMANDS = {
    "doctor": ("hpcddp.doctor", "check the MPI/torch set-up on every rank and measure MPI"),
    "pack": ("hpcddp.data.pack", "write .npy/.npz arrays into an HDF5 file for ShardedLoader"),
}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _COMMANDS:
        print("usage: hpcddp COMMAND [ARGS]\n\ncommands:")
        for name, (_, summary) in _COMMANDS.items():
            print(f"  {name:10} {summary}")
        return 0 if not argv or argv[0] in ("-h", "--help") else 2
    import importlib
    module = importlib.import_module(_COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
