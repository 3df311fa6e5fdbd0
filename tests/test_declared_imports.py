"""Every third-party module the farm's code imports is declared in pyproject.toml, in its
dependencies or one of its extras: an import that works here only because something else pulled the
package in breaks on a clean install. Read from the source (ast), every import, lazy ones included;
the standard library (sys.stdlib_module_names) and the project's own packages are left out, and so
are the Harbor suite's task programs (they run inside their sandboxes, not in the farm)."""

import ast
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("farm", "workers", "envs", "producer", "trainer")
NOT_THE_FARMS = (ROOT / "envs" / "harbor" / "suite",)
# Import name -> distribution name, where they differ beyond case and `_`/`-`.
DISTRIBUTION = {"yaml": "pyyaml"}

# It reads every module of the source tree, where tests/test_architecture.py adds probe modules for
# a moment: the two modules share a group of a parallel run (one worker, one after another).
pytestmark = pytest.mark.xdist_group("source-tree")


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return {normal(re.match(r"[A-Za-z0-9._-]+", spec).group(0)) for spec in specs}


def imported() -> dict[str, str]:
    """Top-level module -> the first file that imports it, for every absolute import in PACKAGES."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if any(path.is_relative_to(skip) for skip in NOT_THE_FARMS):
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def third_party(modules: dict[str, str]) -> dict[str, str]:
    ours = set(PACKAGES) | {"__future__"}
    return {m: where for m, where in modules.items() if m not in sys.stdlib_module_names and m not in ours}


def undeclared(modules: dict[str, str], names: set[str]) -> list[str]:
    return sorted(
        f"{module} (imported by {where})"
        for module, where in third_party(modules).items()
        if normal(DISTRIBUTION.get(module, module)) not in names
    )


def test_every_third_party_import_is_declared():
    modules = imported()
    assert {"redis", "msgspec", "yaml", "fastapi", "torch"} <= set(third_party(modules))  # the walk sees them
    missing = undeclared(modules, declared())
    assert missing == [], "declare these in pyproject.toml's dependencies or the right extra"


def test_an_undeclared_import_is_named():
    """Negative control: the same check with one declared distribution taken away."""
    names = declared() - {"numpy"}
    assert undeclared(imported(), names) == ["numpy (imported by trainer/async_adapter.py)"]
