"""The Lua scripts as files (farm/lua/): each loads, says what it takes, and is called one way.

Each script opens with a table of its KEYS and ARGV, names those positions as locals at the top and
uses only the names after; its function in farm.scripts (the one place that knows its argument
order) lays out as many keys and args as the table says. A table that drifted from its script, or a
function from its table, shows here, not as a Lua error inside Redis. The behaviour of the scripts
is tested where it matters (test_settle, test_transport, test_cancel*, test_fairshare, ...).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from farm import scripts

ROOT = Path(__file__).resolve().parent.parent
LUA = ROOT / "farm" / "lua"
POSITION = re.compile(r"\b(KEYS|ARGV)\[(\d+)\]")

# One tail item per script that has a tail: how many keys and args it adds.
TAILS = {
    "settle": ({"appends": [("farm:results:r", {"f": "v"})]}, 1, 5),
    "drain": ({"tasks": [(b"1|d", "farm:results:r", "t1", 1, b"d")]}, 1, 5),
    "enqueue": ({"items": [b"1|d"]}, 0, 1),
    "renew": ({"ids": ["1-0"]}, 0, 1),
    "release": ({"ids": ["1-0"]}, 0, 1),
    "bucket": ({"counts": {"done": 1}}, 0, 2),
    "requeue": ({"letters": [("1-0", 1, b"d")]}, 0, 3),
}


def wrapper_call(name: str, **tail) -> scripts.Call:
    """Call the script's function with placeholder values and every tail empty (or as given)."""
    fn = getattr(scripts, name)
    values = {}
    for p in inspect.signature(fn).parameters.values():
        ann = str(p.annotation)
        if p.name in tail:
            values[p.name] = tail[p.name]
        elif ann.startswith(("Iterable", "Mapping")):
            values[p.name] = {} if ann.startswith("Mapping") else []
        elif ann == "bool":
            values[p.name] = False
        elif ann in ("int", "float"):
            values[p.name] = 0
        else:
            values[p.name] = "x"
    return fn(**values)


def body(name: str) -> str:
    """The script's own code, its header and include lines left out."""
    text = (LUA / f"{name}.lua").read_text()
    return text.split("\n]]\n", 1)[1]


def test_every_script_has_a_file_and_a_function():
    files = sorted(p.stem for p in LUA.glob("*.lua"))
    assert files == sorted(scripts.SCRIPTS)
    assert {"settle", "retry", "feed", "drain", "enqueue", "promote", "bucket", "requeue"} <= set(files)
    for name in files:
        call = wrapper_call(name)
        assert isinstance(call, scripts.Call) and call.script == name


def test_every_script_loads_into_redis_under_its_sha(sync_redis):
    for name, script in scripts.SCRIPTS.items():
        assert sync_redis.script_load(script.source) == script.sha == scripts.SHAS[name], name
        assert "#include" not in script.source and "--[[" not in script.source, name


@pytest.mark.parametrize("name", sorted(scripts.SCRIPTS))
def test_the_function_lays_out_what_the_table_says(name):
    script = scripts.SCRIPTS[name]
    call = wrapper_call(name)
    assert (len(call.keys), len(call.args)) == (len(script.keys), len(script.argv))
    sample, more_keys, more_args = TAILS.get(name, ({}, 0, 0))
    assert bool(sample) == bool(script.keys_tail or script.argv_tail), f"{name}: a tail in the table, none in TAILS"
    if sample:
        longer = wrapper_call(name, **sample)
        assert len(longer.keys) == len(script.keys) + more_keys
        assert len(longer.args) == len(script.argv) + more_args
        assert bool(more_keys) == bool(script.keys_tail) and bool(more_args) == bool(script.argv_tail)


@pytest.mark.parametrize("name", sorted(scripts.SCRIPTS))
def test_the_table_names_the_locals_and_the_body_uses_only_names(name):
    """Every position in the table is bound once, at the top, to a local of the table's name; no
    `ARGV[8]` further down (a tail is read through a named start: `for k = appended, #KEYS`)."""
    script = scripts.SCRIPTS[name]
    named = {"KEYS": script.keys, "ARGV": script.argv}
    bound: dict[tuple[str, int], str] = {}
    code = [line for line in body(name).splitlines() if line.strip() and not line.startswith("--")]
    top = 0
    for top, line in enumerate(code):  # noqa: B007 - `top` is where the locals end
        m = re.match(r"local ([\w, ]+) = (.+)$", line)
        if not m or not POSITION.search(line):
            break
        names = [n.strip() for n in m[1].split(",")]
        exprs = [e.strip() for e in m[2].split(", ")]
        assert len(names) == len(exprs), line
        for local, expr in zip(names, exprs):
            for kind, pos in POSITION.findall(expr):
                assert (kind, int(pos)) not in bound, f"{name}: {kind}[{pos}] bound twice"
                bound[(kind, int(pos))] = local
    expected = {(kind, i + 1): label for kind, labels in named.items() for i, label in enumerate(labels)}
    assert bound == expected, f"{name}: the locals at the top are not the table's"
    rest = "\n".join(code[top:])
    assert not POSITION.search(rest), f"{name}: a bare position in the body: {POSITION.search(rest)[0]}"


def test_every_shared_function_a_script_calls_is_spliced_into_it():
    """Redis refuses an undefined global only when the line runs; a script calling a shared function
    it did not include would fail on its rare path. Each shared function is also defined once."""
    shared = {m for p in (LUA / "includes").glob("*.lua") for m in re.findall(r"local function (\w+)", p.read_text())}
    for name, script in scripts.SCRIPTS.items():
        for fn in shared:
            defined = script.source.count(f"local function {fn}(")
            assert defined <= 1, f"{name}: {fn} spliced twice"
            if re.search(rf"\b{fn}\(", script.source):
                assert defined == 1, f"{name} calls {fn} without including it"


def test_the_lua_files_ship_in_the_package():
    """An installed wheel carries farm/lua (the module reads it at import): the package-data globs
    (setuptools', relative to the package) cover every file there."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["farm"]
    shipped = {p for g in globs for p in (ROOT / "farm").glob(g)}
    files = set(LUA.rglob("*.lua"))
    assert files and files <= shipped, sorted(str(p) for p in files - shipped)
