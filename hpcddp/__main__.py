"""``python -m hpcddp COMMAND``: the ``hpcddp`` command (``hpcddp.commands``)."""

import sys

from hpcddp.commands import main

if __name__ == "__main__":
    sys.exit(main())
