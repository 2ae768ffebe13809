"""What every ``hpcddp`` command shares: an argument parser whose help is plain text.

The commands' module docstrings are reStructuredText (for Sphinx and readers of the
code); ``--help`` shows them without the markup. Standard library only.
"""

import argparse
import re

from hpcddp.version import __version__

__all__ = ["command_parser", "plain"]

_LITERAL = re.compile(r"``(.+?)``|(?<![\w`])`([^`]+?)`(?![\w`])")


def plain(text: str) -> str:
    """``text`` without reStructuredText's literal and interpreted-text backticks."""
    return _LITERAL.sub(lambda m: m.group(1) or m.group(2), text)


def command_parser(prog: str, docstring: str) -> argparse.ArgumentParser:
    """A parser for ``hpcddp PROG``: the docstring's first paragraph as the description,
    the rest as the epilog, both in plain text, and ``--version``."""
    head, _, rest = docstring.strip().partition("\n\n")
    parser = argparse.ArgumentParser(prog=f"hpcddp {prog}", description=plain(head),
                                     epilog=plain(rest) or None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hpcddp {__version__}")
    return parser
