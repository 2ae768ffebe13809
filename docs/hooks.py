"""MkDocs hooks: the settings page's table, written from ``hpcddp/env/config.py``, and
the tests page's index of which test files reach each module, read from ``tests/``."""

import re
from pathlib import Path

from hpcddp.env.config import describe_settings

ROOT = Path(__file__).resolve().parents[1]
INDEX_MARK = "<!-- test-index -->"
_NAMED = re.compile(r"\bhpcddp(?:\.\w+)+")
_FROM = re.compile(r"^\s*from (hpcddp(?:\.\w+)*) import \(?([\w, \n]+)\)?", re.M)

MARK = "<!-- settings-table -->"


def _default(kind, value):
    if value is None:
        return "unset"
    if kind == "bool":
        return "`1`" if value else "`0`"
    return f"`{value}`" if value != "" else "empty"


def settings_table():
    """The Markdown table of every setting: variable, kind, default, meaning."""
    rows = ["| variable | kind | default | meaning |", "|---|---|---|---|"]
    for name, kind, default, text in describe_settings():
        rows.append(f"| `{name}` | {kind} | {_default(kind, default)} | "
                    f"{text.replace('|', chr(92) + '|')} |")
    return "\n".join(rows)


def _modules():
    """Every module of the package, by dotted name (a package by its ``__init__``)."""
    names = {}
    for path in sorted((ROOT / "hpcddp").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _reached(text, modules):
    """The modules a test file names: imported, or named in a string (a monkeypatch)."""
    named = set(_NAMED.findall(text))
    for package, names in _FROM.findall(text):
        named |= {f"{package}.{name.strip()}" for name in names.split(",") if name.strip()}
    found = set()
    for name in named:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules and name != "hpcddp":
            found.add(name)
    return found


def test_index():
    """The Markdown table: each module, and the test files that import or name it."""
    modules = _modules()
    tests = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for name in _reached(path.read_text(), modules):
            tests.setdefault(name, []).append(str(path.relative_to(ROOT / "tests")))
    rows = ["| module | test files that import or name it |", "|---|---|"]
    for name in sorted(modules):
        if name == "hpcddp":  # every test imports the package
            continue
        files = (", ".join(f"`{f}`" for f in tests.get(name, []))
                 or "none by name: reached through the modules that use it")
        rows.append(f"| `{name}` | {files} |")
    return "\n".join(rows)


def on_page_markdown(markdown, page, **_):
    if page.file.src_path == "settings.md":
        if MARK not in markdown:
            raise ValueError(f"settings.md lost its {MARK} line")
        return markdown.replace(MARK, settings_table())
    if page.file.src_path == "tests.md":
        if INDEX_MARK not in markdown:
            raise ValueError(f"tests.md lost its {INDEX_MARK} line")
        return markdown.replace(INDEX_MARK, test_index())
    return markdown
