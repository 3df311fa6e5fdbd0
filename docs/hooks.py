"""The configuration page's settings tables, generated from farm/settings.py and kept in the page.

Hand-kept tables of settings drift: a field is added, a default changes, and the page still shows the
old one. So the tables in docs/configuration.md, between the markers below, are written by this
module from the code itself: `python docs/hooks.py --write` regenerates them (`--check` only
compares). Each field's name, type and default come from `farm.settings.Settings` (msgspec), its
environment variable is `FARM_` + the upper-case name (exactly what `load_settings` reads), and its
comment from the source (the one on its line, or the lines above it). The groups are named below by
the field that opens each. The tables live in the file, not only in the built site, so the page reads
right on GitHub too; tests/test_docs_config.py and, as an MkDocs hook, the site build fail when they
differ from what the code gives, naming the command that regenerates them.

The longer explanations a reader needs (what `reclaim_interval_s` is for, which values a URL takes)
live in docs/settings-notes.yml, one entry per field. A note for a field that no longer exists fails,
and so does a field with neither a note nor a comment, so neither can go stale silently.
"""

from __future__ import annotations

import argparse
import inspect
import io
import re
import sys
import tokenize
import typing
from pathlib import Path
from typing import Any

import msgspec
import yaml
from mkdocs.exceptions import PluginError

from farm import settings as farm_settings

PAGE = "configuration.md"
PAGE_PATH = Path(__file__).with_name(PAGE)
NOTES = Path(__file__).with_name("settings-notes.yml")
REGENERATE = "python docs/hooks.py --write"
# The generated tables sit between these two lines of the page.
BEGIN = f"<!-- settings-tables: generated from farm/settings.py and docs/settings-notes.yml by `{REGENERATE}` -->"
END = "<!-- /settings-tables -->"


# The groups of the tables, each named by the field that opens it; later fields follow in the
# class's own order, so a new field lands in the group of the field above it.
GROUPS = {
    "redis_url": "Where the queue lives",
    "max_attempts": "Delivery",
    "concurrency": "Worker",
    "connect_backoff_s": "Connection to Redis",
    "history": "What workers record for the dashboards",
    "cancel_ttl_s": "Cancels and collection",
    "policy_urls": "Policy",
    "dashboard_token": "The dashboard",
    "agents": "Agents",
    "gateway_host": "The model gateway",
    "log_level": "Logging",
}


def field_comments(source: str) -> dict[str, str]:
    """Each Settings field's comment in the source: the one on its line (or in its parenthesised
    value), else the block of comment lines directly above it."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class Settings("))
    comments: dict[str, str] = {}
    above: list[str] = []
    for number, line in enumerate(lines[start + 1 :], start + 1):
        stripped = line.strip()
        if stripped.startswith("def "):
            break
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and match.group(1) in farm_settings.FIELDS:
            own = _line_comments(lines, number)
            comments[match.group(1)] = " ".join(own or above)
        above = []
    return {name: text for name, text in comments.items() if text}


def _line_comments(lines: list[str], number: int) -> list[str]:
    """The comments on a field's line, or on the lines of a value in parentheses that it opens."""
    text = lines[number]
    if text.rstrip().endswith("("):
        end = next(i for i in range(number + 1, len(lines)) if lines[i].strip().startswith(")"))
        text = "\n".join(lines[number : end + 1])
    tokens = tokenize.generate_tokens(io.StringIO(text.strip() + "\n").readline)
    return [tok.string.lstrip("#").strip() for tok in tokens if tok.type == tokenize.COMMENT]


def load_notes(path: Path = NOTES) -> dict[str, str]:
    notes = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(notes) - set(farm_settings.FIELDS))
    if unknown:
        raise ValueError(f"{path.name} describes settings that farm.settings.Settings no longer has: {unknown}")
    return {name: " ".join(str(text).split()) for name, text in notes.items()}


def default_text(name: str, value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value in ([], {}):
        return "none"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1 << 20 and value % (1 << 20) == 0:
        return f"`{value}` ({value >> 20} MiB)"
    return f"`{msgspec.json.encode(value).decode() if not isinstance(value, (str, int, float)) else value}`"


def type_text(annotation: Any) -> str:
    """A field's type in words without `|`, which would split a table cell."""
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(f"`{value}`" for value in args)
    if type(None) in args:
        rest = [arg for arg in args if arg is not type(None)]
        return (type_text(rest[0]) if len(rest) == 1 else " or ".join(map(type_text, rest))) + " or none"
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return "`" + text.replace("typing.", "").replace("farm.settings.", "") + "`"


def env_text(name: str, value: Any) -> str:
    """`FARM_` + the name, as load_settings reads it; a list or mapping only where it parses one."""
    if isinstance(value, (list, dict)) and f'"{name}"' not in inspect.getsource(farm_settings.load_settings):
        return "none (the file only)"
    return f"`{farm_settings.ENV_PREFIX}{name.upper()}`"


def settings_markdown(notes: dict[str, str] | None = None) -> str:
    """The tables that replace the marker on the configuration page: every Settings field, grouped."""
    source = Path(farm_settings.__file__)
    comments = field_comments(source.read_text())
    notes = load_notes() if notes is None else notes
    defaults = farm_settings.Settings()
    hints = _type_hints()
    gone = sorted(set(GROUPS) - set(farm_settings.FIELDS))
    if gone or farm_settings.FIELDS[0] not in GROUPS:
        raise ValueError(f"docs/hooks.py's GROUPS name settings that are gone or miss the first one: {gone}")
    out: list[str] = []
    for name in farm_settings.FIELDS:
        if name in GROUPS:
            out += ["", f"### {GROUPS[name]}", "", "| setting | default | environment variable | type | meaning |"]
            out.append("| --- | --- | --- | --- | --- |")
        meaning = notes.get(name) or comments.get(name)
        if not meaning:
            raise ValueError(f"setting {name} has no comment in {source.name} and no note in {NOTES.name}")
        row = [f"`{name}`", default_text(name, getattr(defaults, name))]
        row += [env_text(name, getattr(defaults, name)), type_text(hints[name])]
        out.append("| " + " | ".join(row + [meaning.replace("|", "\\|")]) + " |")
    return "\n".join(out).strip() + "\n"


def _type_hints() -> dict[str, Any]:
    return typing.get_type_hints(farm_settings.Settings)


# -- the page --------------------------------------------------------------------------------------


def with_tables(page: str, tables: str) -> str:
    """The page with `tables` between its markers (ValueError when a marker is missing)."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"{PAGE} must hold the lines {BEGIN!r} and {END!r} once each, in that order")
    head, rest = page.split(BEGIN)
    return head + BEGIN + "\n\n" + tables + "\n" + END + rest.split(END, 1)[1]


def stale(page: str) -> str | None:
    """Why the page's tables are not what the code gives, or None when they are."""
    if with_tables(page, settings_markdown()) == page:
        return None
    return f"docs/{PAGE}: its settings tables differ from farm/settings.py: run `{REGENERATE}`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=f"Regenerate or check the settings tables of docs/{PAGE}.")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--write", action="store_true", help="rewrite the tables in the page from the code")
    how.add_argument("--check", action="store_true", help="only say whether they differ (the default)")
    write = parser.parse_args(argv).write
    page = PAGE_PATH.read_text()
    try:
        if write:
            new = with_tables(page, settings_markdown())
            if new != page:
                PAGE_PATH.write_text(new)
            print(f"docs/{PAGE}: {'tables regenerated' if new != page else 'tables already up to date'}")
            return 0
        problem = stale(page)
    except ValueError as exc:
        print(f"docs/hooks.py: {exc}", file=sys.stderr)
        return 1
    print(problem or f"docs/{PAGE}: tables up to date", file=sys.stderr if problem else sys.stdout)
    return 1 if problem else 0


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The site build's check: the page is built as it is in the file, and fails when it is stale."""
    if page.file.src_uri != PAGE:
        return markdown
    try:
        problem = stale(markdown)
    except ValueError as exc:  # a setting without a meaning, a note for a setting that is gone, a lost marker
        raise PluginError(f"{PAGE}: {exc}") from None
    if problem:
        raise PluginError(problem)
    return markdown


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
