"""MkDocs hook: the settings page's table, written from ``hpcddp/env/config.py``."""

from hpcddp.env.config import describe_settings

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


def on_page_markdown(markdown, page, **_):
    if page.file.src_path == "settings.md":
        if MARK not in markdown:
            raise ValueError(f"settings.md lost its {MARK} line")
        return markdown.replace(MARK, settings_table())
    return markdown
