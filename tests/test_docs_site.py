"""The docs site: its configuration page lists every setting as the code defines it, and the site
builds with `mkdocs build --strict` (a broken link, a missing page, an API reference that no longer
resolves all fail it). scripts/test builds it too; the build here also reads what came out."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from farm.settings import FIELDS, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).with_name("mkdocs")


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table_rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines():
        match = re.match(r"\| `(\w+)` \| (.*) \|$", line)
        if match:
            rows[match.group(1)] = [cell.strip() for cell in match.group(2).split(" | ")]
    return rows


def test_the_configuration_page_lists_every_setting_with_its_default_and_variable():
    rows = table_rows(load_hooks().settings_markdown())
    assert list(rows) == list(FIELDS)  # every field, once, in the class's order
    defaults = Settings()
    for name, (default, env, _type, meaning) in rows.items():
        assert meaning, name
        value = getattr(defaults, name)
        if value is None or value in ([], {}):
            assert default == "none", name
            continue
        assert env == f"`FARM_{name.upper()}`", name
        # The documented default, given through the documented variable, is the default itself.
        shown = default.split("`")[1]
        assert getattr(load_settings(env={f"FARM_{name.upper()}": shown}), name) == value, name


def test_a_note_for_a_setting_that_is_gone_fails_the_page(tmp_path):
    hooks = load_hooks()
    assert set(hooks.load_notes()) <= set(FIELDS)
    stale = tmp_path / "settings-notes.yml"
    stale.write_text(hooks.NOTES.read_text() + "retired_setting: a setting the code no longer has\n")
    with pytest.raises(ValueError, match="retired_setting"):
        hooks.load_notes(stale)


def test_a_setting_with_no_meaning_fails_the_page():
    hooks = load_hooks()
    comments = hooks.field_comments(Path(sys.modules["farm.settings"].__file__).read_text())
    bare = next(name for name in FIELDS if name not in comments)  # one the notes alone explain
    notes = {name: text for name, text in hooks.load_notes().items() if name != bare}
    with pytest.raises(ValueError, match=bare):
        hooks.settings_markdown(notes)


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """The build scripts/test runs (without --quiet, which would hide the warnings --strict counts)."""
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.slow
def test_the_site_builds_strict_with_the_generated_tables_and_the_api_reference(tmp_path):
    site = tmp_path / "site"
    done = build(ROOT / "mkdocs.yml", site)
    assert done.returncode == 0, done.stderr[-4000:]
    page = (site / "configuration" / "index.html").read_text()
    for name in FIELDS:
        assert f"<code>{name}</code>" in page, name
    for name, value in msgspec.structs.asdict(Settings()).items():
        if not isinstance(value, (list, dict)):
            assert f"<code>FARM_{name.upper()}</code>" in page, name
    farm_ref = (site / "reference" / "farm" / "index.html").read_text()
    for anchor in ("farm.client.FarmClient", "farm.schema.Task", "farm.schema.Rollout", "farm.settings.load_settings"):
        assert f'id="{anchor}"' in farm_ref, anchor
    trainer_ref = (site / "reference" / "trainer" / "index.html").read_text()
    assert 'id="trainer.train.build_trainer"' in trainer_ref
    assert (site / "dashboard" / "overview-1400.png").exists()  # the screenshots ship with the site


@pytest.mark.slow
def test_a_broken_link_fails_the_build(tmp_path):
    """Negative control: the same build of the same pages, one link pointing nowhere."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\nSee [a page that does not exist](no-such-page.md).\n")
    (tmp_path / "mkdocs.yml").write_text(f"INHERIT: {ROOT / 'mkdocs.yml'}\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr


# -- the README: a front page ---------------------------------------------------------------------
README = ROOT / "README.md"


def test_the_readme_is_a_front_page_whose_links_all_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= 250, "the README is a front page: its detail belongs in docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#")[0] for link in links if not re.match(r"[a-z]+://", link)]
    assert local and not [link for link in local if not (ROOT / link).exists()]
    assert not re.search(r"\b(RUN_FIRST|RUN_WARM|FAST_TIME)\b", text), "a figure was left unmeasured"


async def test_the_readmes_environment_runs_as_printed():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    source = next(b for b in blocks if "class Pantry(Environment)" in b)
    namespace: dict = {}
    exec(compile(source, "README.md", "exec"), namespace)
    env = namespace["Pantry"]()
    row = env.check_row({"responses_create_params": {"input": "Add 2 rice."}, "expected": {"rice": 2}})
    state = env.new_state(row)
    assert (await namespace["TOOLS"]["add_item"](state, {"item": "rice", "count": 2})) == {"item": "rice", "stock": 2}
    transcript = namespace["Transcript"](final_text="done", output=[], tool_calls=[])
    assert (await env.verify(row, state, transcript)).reward == 1.0
    assert (await env.verify(row, {}, transcript)).reward == 0.0
    for block in blocks:  # the other snippets at least compile
        compile(block, "README.md", "exec")
