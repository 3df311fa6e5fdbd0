"""The configuration page keeps its settings tables in the file (so it reads right on GitHub, not
only in the built site), and they are what farm/settings.py and docs/settings-notes.yml give: a
setting added, renamed or given a new default without regenerating them fails here, and the
failure names the command that regenerates them (`python docs/hooks.py --write`)."""

import importlib.util
import re
from pathlib import Path

import pytest

from farm.settings import FIELDS

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "configuration.md"


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pages_tables_are_the_ones_the_code_gives():
    hooks = load_hooks()
    page = PAGE.read_text()
    assert hooks.stale(page) is None, hooks.stale(page)
    # Every setting is in the file itself, one row each, in the class's order.
    rows = re.findall(r"^\| `(\w+)` \|", page, re.M)
    assert rows == list(FIELDS)


def test_a_setting_missing_from_the_page_fails_and_names_the_command():
    """Negative control: the page as it would be had a setting been added to the code after the
    tables were last generated (its row is missing)."""
    hooks = load_hooks()
    page = PAGE.read_text()
    missing = FIELDS[len(FIELDS) // 2]
    older = re.sub(rf"^\| `{missing}` \|.*\n", "", page, flags=re.M)
    assert older != page
    problem = hooks.stale(older)
    assert problem and "python docs/hooks.py --write" in problem
    # A changed default is caught the same way.
    assert hooks.stale(page.replace("| `farm` |", "| `farms` |", 1))


def test_write_regenerates_the_tables_in_place(tmp_path, monkeypatch):
    hooks = load_hooks()
    copy = tmp_path / "configuration.md"
    page = PAGE.read_text()
    copy.write_text(re.sub(r"^\| `namespace` \|.*\n", "", page, flags=re.M))
    monkeypatch.setattr(hooks, "PAGE_PATH", copy)
    assert hooks.main(["--check"]) == 1
    assert hooks.main(["--write"]) == 0
    assert copy.read_text() == page
    assert hooks.main(["--check"]) == 0


def test_a_page_without_its_markers_is_refused():
    hooks = load_hooks()
    with pytest.raises(ValueError, match="settings-tables"):
        hooks.stale(PAGE.read_text().replace(hooks.END, ""))
