"""The `slow` marker, enforced: a test that starts a process or a listening server without it fails.

`scripts/test --fast` runs `-m "not slow"`, so the marker is what keeps the inner loop fast; a
marker nobody checks drifts. For the whole session, the ways a test starts a process
(`subprocess.Popen`, which `subprocess.run`, asyncio's subprocesses and Playwright's driver all go
through; `multiprocessing`'s `Process.start`, which pools and process executors use; `os.fork`,
`os.system`, `os.posix_spawn`) and a server (`socket.listen`, whatever the server library) are
wrapped to record what was started, in which test and in which fixture. A test without `slow`
then fails, naming what it started, when its setup or its body started anything, or when it uses
a fixture that started something for an earlier test: a session fixture such as `vllm` starts its
server once, but every test that uses it needs that server. Two fixtures are exempt, the
suite's infrastructure rather than the test's: the test Redis that `redis_url` starts when none
answers (every queue test uses it), and `model_dir`, which prepares the model once per machine
(vLLM's virtualenv and a conversion, which `scripts/test` starts in the background; a test that
only reads the tokenizer is not slow because its run happened to come first). Fixture teardown
is not checked (a session fixture's teardown runs in whichever test happens to be last).
"""

from __future__ import annotations

import functools
import multiprocessing.process
import os
import socket
import subprocess
import threading

import pytest

# Fixtures whose processes are the suite's infrastructure rather than the test's.
EXEMPT_FIXTURES = frozenset({"redis_url", "model_dir"})


def _describe_command(args) -> str:
    words = [str(a) for a in args] if isinstance(args, (list, tuple)) else [str(args)]
    text = " ".join(words)
    return text if len(text) <= 160 else text[:157] + "..."


def _describe_address(sock: socket.socket) -> str:
    try:
        address = sock.getsockname()
    except OSError:
        return "a socket"
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return repr(address)


class SlowMarkerCheck:
    """The pytest plugin: records what each test's setup and call start, and fails the unmarked."""

    def __init__(self, exempt_fixtures: frozenset[str] = EXEMPT_FIXTURES):
        self.exempt = exempt_fixtures
        self.events: list[tuple[str, object]] | None = None  # (what, FixtureDef or None) in the running phase
        self.fixtures: list = []  # the FixtureDefs being set up, innermost last
        self.started_by: dict = {}  # FixtureDef -> the first thing it started (names repeat across modules)
        self.inside = threading.local()  # one record for a start that goes through two wrapped calls
        self.undo: list[tuple[object, str, object]] = []

    # -- recording --------------------------------------------------------------------------

    def record(self, what: str) -> None:
        events = self.events
        if events is None:  # collection, or between tests
            return
        fixture = self.fixtures[-1] if self.fixtures else None
        if fixture is not None and fixture.argname in self.exempt:
            return
        if fixture is not None:
            self.started_by.setdefault(fixture, what)
        events.append((what, fixture))

    def _wrap(self, owner, name: str, describe) -> None:
        original = getattr(owner, name)
        check = self

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if getattr(check.inside, "active", False):
                return original(*args, **kwargs)
            check.record(describe(*args, **kwargs))
            check.inside.active = True
            try:
                return original(*args, **kwargs)
            finally:
                check.inside.active = False

        self.undo.append((owner, name, original))
        setattr(owner, name, wrapper)

    def install(self) -> None:
        def popen(proc, args, *rest, **kw):
            return f"a subprocess: {_describe_command(args)}"

        def mp_start(proc):
            return f"a multiprocessing process: {proc.name}"

        self._wrap(subprocess.Popen, "_execute_child", popen)
        self._wrap(multiprocessing.process.BaseProcess, "start", mp_start)
        self._wrap(os, "fork", lambda: "a process: os.fork()")
        self._wrap(os, "system", lambda command: f"a process: os.system({command!r})")
        for name in ("posix_spawn", "posix_spawnp"):
            if hasattr(os, name):
                self._wrap(os, name, lambda path, argv, *a, **k: f"a process: {_describe_command(argv)}")
        self._wrap(socket.socket, "listen", lambda sock, *a: f"a server listening on {_describe_address(sock)}")

    def uninstall(self) -> None:
        for owner, name, original in reversed(self.undo):
            setattr(owner, name, original)
        self.undo.clear()

    # -- pytest hooks -----------------------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        self.fixtures.append(fixturedef)
        try:
            yield
        finally:
            self.fixtures.pop()

    def _phase(self, item, phase: str):
        self.events = []
        try:
            yield
        finally:
            item.stash.setdefault(_EVENTS, {})[phase] = self.events
            self.events = None

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item):
        yield from self._phase(item, "setup")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):
        yield from self._phase(item, "call")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if call.when not in ("setup", "call") or item.get_closest_marker("slow") is not None:
            return
        started = self.violations(item, call.when)
        if not started:
            return
        message = (
            f"{item.nodeid} has no `slow` marker but started:\n"
            + "".join(f"  - {what}\n" for what in started)
            + "A test that starts a process or a server is slow: mark it (pytest.mark.slow, or the module's "
            "pytestmark), or keep it in this process (see tests/helpers/markers.py)."
        )
        if report.passed:
            report.outcome = "failed"
            report.longrepr = message
        elif report.failed:
            report.sections.append(("slow marker check", message))

    def violations(self, item, when: str) -> list[str]:
        events = item.stash.get(_EVENTS, {}).get(when, [])
        out, seen = [], set()
        for what, fixture in events:
            out.append(what if fixture is None else f"{what} (in fixture {fixture.argname!r})")
            seen.add(fixture)
        if when == "setup":
            # The fixtures this test uses, overridden ones included (private to pytest, stable since 3.x).
            for defs in item._fixtureinfo.name2fixturedefs.values():
                for fixture in defs:
                    if fixture in self.started_by and fixture not in seen:
                        what = self.started_by[fixture]
                        out.append(f"{what} (in fixture {fixture.argname!r}, started for an earlier test)")
        return list(dict.fromkeys(out))


_EVENTS = pytest.StashKey[dict]()


def register(config) -> None:
    """Install the check for this session (conftest's pytest_configure calls it)."""
    check = SlowMarkerCheck()
    check.install()
    config.add_cleanup(check.uninstall)
    config.pluginmanager.register(check, "slow-marker-check")
