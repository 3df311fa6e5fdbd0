"""The layers point down, and the contracts that say so can fail (`.importlinter`, run by scripts/test)."""

from __future__ import annotations

import ast
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import ROOT

LINT = Path(sys.executable).with_name("lint-imports")

# Some of these tests add a probe module to the source tree for a moment, which the others would
# read: under a parallel run (scripts/test) the module's tests run on one worker, one after another.
pytestmark = pytest.mark.xdist_group("source-tree")


def lint() -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_the_import_contracts_hold():
    out = lint()
    assert out.returncode == 0, out.stdout + out.stderr
    assert "6 kept, 0 broken" in out.stdout


def broken_by(package: str, line: str) -> str:
    """lint-imports' report with a probe module holding `line` added to `package`; it must fail."""
    probe = ROOT / package / f"_probe_{uuid.uuid4().hex[:8]}.py"  # package: a directory under the root
    probe.write_text(line + "  # noqa: F401\n")
    try:
        out = lint()
    finally:
        probe.unlink()
    assert out.returncode != 0, out.stdout
    return out.stdout.replace(probe.stem, "PROBE")


@pytest.mark.slow
def test_an_upward_import_breaks_the_core_contract():
    """A module of the core that imports a worker module: lint-imports must fail and name it."""
    assert "farm.PROBE -> workers.delivery.runtime" in broken_by("farm", "import workers.delivery.runtime")


@pytest.mark.slow
def test_an_environment_importing_a_worker_breaks_its_contract():
    assert "envs.PROBE -> workers.loops.agent" in broken_by("envs", "from workers.loops.agent import available_agents")


@pytest.mark.slow
def test_an_environment_reaching_past_the_sdk_breaks_its_contract():
    """Environments take what they need of the farm from envs.sdk, not from the core's modules."""
    assert "envs.workplace.PROBE -> farm.settings" in broken_by("envs/workplace", "from farm.settings import Settings")


@pytest.mark.slow
def test_a_new_environment_module_is_covered_by_the_sdk_contract_without_being_named():
    """The contract names `envs.*`, not a list: an environment added tomorrow is held to it too."""
    assert "envs.PROBE -> farm.settings" in broken_by("envs", "from farm.settings import Settings")


@pytest.mark.slow
def test_a_policy_client_importing_an_agent_loop_breaks_the_workers_layers():
    assert "workers.policy.PROBE -> workers.loops.agent" in broken_by("workers/policy", "import workers.loops.agent")


@pytest.mark.slow
def test_an_agent_loop_importing_the_delivery_breaks_the_workers_layers():
    assert "workers.loops.PROBE -> workers.delivery.runtime" in broken_by(
        "workers/loops", "import workers.delivery.runtime"
    )


@pytest.mark.slow
def test_the_sdk_importing_an_environment_breaks_its_contract():
    assert "envs.sdk.PROBE -> envs.math" in broken_by("envs/sdk", "import envs.math")


PACKAGES = ("farm", "workers", "envs", "producer", "trainer")


def test_no_module_is_over_400_lines():
    """A module is one concept; past 400 lines it is usually two (ruff's PLR0915 bounds functions at 60 statements)."""
    long = {
        str(p.relative_to(ROOT)): n
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert long == {}


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (a function-level import counts too), and every
    module it runs (`"-m", "module"` in a command line)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            found.update(m for flag, m in zip(words, words[1:]) if flag == "-m" and isinstance(m, str))
    return found


def benchmarks_imported(path: Path) -> list[str]:
    return sorted(m for m in imported_modules(path) if m == "bench" or m.startswith("bench."))


def test_no_test_imports_a_benchmark(tmp_path):
    """Tests and benchmarks share the policy stub through workers.policy.stub, never through bench/."""
    probe = tmp_path / "test_probe.py"  # the negative control: an import inside a function is found
    probe.write_text(
        "def test_x():\n    from bench.concurrency import rows\n    run(['python', '-m', 'bench.learn'])\n"
    )
    assert benchmarks_imported(probe) == ["bench.concurrency", "bench.learn"]
    found = {p.name: benchmarks_imported(p) for p in sorted((ROOT / "tests").glob("*.py"))}
    assert {name: mods for name, mods in found.items() if mods} == {}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports anywhere in its body: at the top, inside functions
    (lazy imports) and under `if TYPE_CHECKING:` alike, since each of those is still a cycle to read."""
    modules = {}
    for pkg in PACKAGES:
        for path in (root / pkg).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(here[: len(here) - node.level + 1] + [node.module or ""]) if node.level else node.module
                base = (base or "").strip(".")
                targets |= {base} | {f"{base}.{a.name}" for a in node.names}
        deps = {m for t in targets if (m := known(t)) and m != name and not name.startswith(m + ".")}
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles_not_even_lazy_or_type_checking_ones():
    assert cycles(import_graph(ROOT)) == []


def test_the_cycle_check_finds_a_lazy_and_a_type_checking_cycle(tmp_path):
    """The negative control: two modules that import each other only lazily / for type checking."""
    pkg = tmp_path / "farm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from farm.b import g\n    return g\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from farm.a import f\ndef g(): ...\n"
    )
    (pkg / "c.py").write_text("from . import a\n")
    for other in PACKAGES[1:]:
        (tmp_path / other).mkdir()
    assert cycles(import_graph(tmp_path)) == [["farm.a", "farm.b"]]
