"""The sandbox base tree's and the local Dockerfile subset's pure parts (no process started):
the Debian mirror read from apt's sources in both formats, the manifest that marks a whole tree,
`farm sandbox base`'s one-line errors, and the Dockerfile parser's errors naming their line.

The build itself (debootstrap, minutes) runs where it is needed: helpers.sandboxes builds the tree
for tests/test_sandbox_local.py when it is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs.boxes.aliases import DEFAULT_ALIASES
from envs.boxes.base import BASE_IMAGE, load_base, mirror_url
from envs.boxes.dockerfile import check, parse
from envs.boxes.images import is_base
from envs.sdk.sandbox import SandboxStartError, SandboxUnavailable
from farm.cli import main

DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main

Types: deb-src
URIs: http://src.example/debian
Suites: bookworm

Types: deb
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
"""


def _apt(tmp_path: Path, sources_list: str = "", extra: dict[str, str] | None = None) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text(sources_list)
    for name, text in (extra or {}).items():
        (apt / "sources.list.d" / name).write_text(text)
    return apt


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    apt = _apt(tmp_path, extra={"debian.sources": DEB822, "node.list": "deb https://n.example/node nodistro main\n"})
    assert mirror_url(env={}, apt_dir=apt) == "http://mirror.example/debian"


def test_mirror_from_one_line_sources_and_override(tmp_path: Path) -> None:
    apt = _apt(
        tmp_path,
        "# deb http://old.example/debian bookworm main\ndeb [arch=amd64] http://one.example/debian bookworm main\n",
    )
    assert mirror_url(env={}, apt_dir=apt) == "http://one.example/debian"
    assert mirror_url(env={"FARM_SANDBOX_MIRROR": "http://mine.example/d"}, apt_dir=apt) == "http://mine.example/d"


def test_no_mirror_is_one_line_saying_what_to_set(tmp_path: Path) -> None:
    apt = _apt(tmp_path, "deb http://other.example/ubuntu noble main\n")
    with pytest.raises(SandboxUnavailable, match="^no apt source serves Debian bookworm .* set FARM_SANDBOX_MIRROR"):
        mirror_url(env={}, apt_dir=apt)


def test_a_tree_without_its_manifest_is_no_tree(tmp_path: Path) -> None:
    home = tmp_path / "sandbox" / "bookworm"
    (home / "rootfs" / "bin").mkdir(parents=True)
    assert load_base(tmp_path) is None  # a half-written tree is never used
    (home / "manifest.json").write_text(json.dumps({"content_id": "abc"}))
    tree = load_base(tmp_path)
    assert tree is not None and tree.content_id == "abc" and tree.rootfs == home / "rootfs"


def test_farm_sandbox_base_without_debootstrap(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FARM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr("os.geteuid", lambda: 0)
    assert main(["sandbox", "base", "--no-docker"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "farm: debootstrap is not installed: apt-get install debootstrap"
    )
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    assert main(["sandbox", "base", "--no-docker"]) == 2
    assert "needs root" in capsys.readouterr().err


def test_dockerfile_parse_joins_continuations_and_numbers_lines() -> None:
    steps = parse("# syntax=docker/dockerfile:1\nFROM debian:bookworm\n\nRUN a \\\n  # inside\n  && b\nenv X=1\n")
    assert [(s.line, s.op, s.args) for s in steps] == [
        (2, "FROM", "debian:bookworm"),
        (4, "RUN", "a  && b"),
        (7, "ENV", "X=1"),
    ]


@pytest.mark.parametrize(
    "text, error",
    [
        ("FROM ubuntu:24.04\nRUN x\nONBUILD RUN y\n", "^Dockerfile line 3: ONBUILD is not supported"),
        ("FROM ubuntu:24.04\nCOPY --from=a /x /y\n", "^Dockerfile line 2: COPY --from"),
        ("FROM ubuntu:24.04 AS a\nFROM ubuntu:24.04\n", "^Dockerfile line 2: FROM again: multi-stage"),
        ("FROM alpine:3\n", "^Dockerfile line 1: FROM alpine:3: the local backend builds only on its base"),
        ("RUN x\n", "^Dockerfile line 1: no FROM"),
    ],
)
def test_dockerfile_outside_the_subset(text: str, error: str) -> None:
    with pytest.raises(SandboxStartError, match=error):
        check(parse(text), DEFAULT_ALIASES)


def test_base_aliases() -> None:
    assert all(is_base(n, DEFAULT_ALIASES) for n in (BASE_IMAGE, "ubuntu:24.04", "debian:bookworm", "python:3.12-slim"))
    assert not is_base("alpine:3.19", DEFAULT_ALIASES)
    assert is_base("alpine:3.19", {"alpine:*": BASE_IMAGE})
    steps = check(parse('FROM python:3.11\nLABEL a=b\nCMD ["bash"]\nRUN true\n'), DEFAULT_ALIASES)
    assert [s.op for s in steps] == ["RUN"]  # CMD and LABEL change nothing in a sandbox
