"""`farm dead list|show|requeue|purge --agent NAME`: the dead letters of one agent."""

from __future__ import annotations

import json
from typing import Optional

import click

from farm.cli.base import CONTEXT, COUNT, Globals, cli, pass_globals
from farm.errors import ConfigError, UnknownAgent


@cli.group(context_settings=CONTEXT)
def dead() -> None:
    """Dead letters: tasks that ran out of attempts or could not be read, with the reason."""


def _open(g: Globals, agent: str):
    """Settings and a client, once `agent` is known: a mistyped name exits 5, as `farm worker` does,
    instead of reading an empty stream and reporting nothing to do."""
    from farm.connection import connect_sync

    s = g.settings()
    if not s.redis_url:
        s = s.replace(redis_url=f"redis://127.0.0.1:{s.embedded_port}/0")
    r = connect_sync(s)
    _known(s, r, agent)
    return s, r


def _known(s, r, agent: str) -> None:
    """An agent is known when anything here defines it (workers.loops.agent.known_agents, which `farm collect`
    and `farm data prepare` check names against) or the namespace has seen it: in its `agents` set, or
    with dead letters of its own. A stream that a worker elsewhere serves under another name
    (`farm worker --agent weather --impl single_tool_call`) is defined on that host alone, and its dead
    letters must stay readable and requeueable from here."""
    from farm.transport import errors
    from workers.loops.agent import known_agents

    defined = known_agents(s)
    if agent in defined:
        return
    with errors(s.redis_url):
        seen = {a.decode(errors="replace") for a in r.smembers(s.keys.agents())}
        if agent in seen or r.exists(s.keys.dead(agent)):
            return
    raise UnknownAgent(
        f"unknown agent {agent!r}: no tasks or dead letters in namespace {s.namespace!r} and not defined here "
        f"(check --agent and --namespace); known: {', '.join(sorted(defined | seen))}"
    )


def _where(s) -> str:
    from farm.transport import redact

    return f"Redis {redact(s.redis_url)}, namespace {s.namespace!r}"


AGENT = click.option("--agent", required=True, help="the agent whose dead letters to read.")


@dead.command("list", epilog="Example:\n\n  farm dead list --agent math --count 20")
@AGENT
@click.option("--count", type=COUNT, default=50, show_default=True, help="newest letters to show.")
@click.option("--json", "as_json", is_flag=True, help="print JSON lines instead of a table.")
@pass_globals
def dead_list(g: Globals, agent, count, as_json) -> int:
    """The newest dead letters: when, kind, attempts, task id and reason."""
    from rich.console import Console
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    from farm.deadletters import count_dead, list_dead
    from farm.transport import errors

    s, r = _open(g, agent)
    with errors(s.redis_url):
        total = count_dead(r, s.keys, agent)
        letters = list_dead(r, s.keys, agent, count, max_entry_bytes=s.max_entry_bytes)
    if as_json:
        for letter in letters:
            print(json.dumps(letter))
        return 0
    console = Console()  # the terminal's width (COLUMNS where set; 80 in a pipe)
    console.print(_where(s), highlight=False, soft_wrap=True)
    console.print(f"{total:,} dead letter(s) for {agent!r}, newest first", highlight=False)
    if console.width < 120:  # each letter on two lines: what and when, then the whole reason
        for letter in letters:
            when = letter["at_iso"][:19].replace("T", " ")
            head = f"{letter['id']}  {when}  {letter['kind']}  tries {letter['attempts']}  task {letter['task_id']}"
            console.print(head, highlight=False, markup=False, overflow="ellipsis", no_wrap=True)
            console.print(Padding(Text(letter["reason"]), (0, 0, 0, 4)))
        return 0
    t = Table(pad_edge=False, box=None)
    for name in ("id", "when (UTC)", "kind", "tries", "task"):
        t.add_column(name, no_wrap=True, justify="right" if name == "tries" else "left")
    t.add_column("reason", overflow="fold", ratio=1)
    for letter in letters:
        when = letter["at_iso"][:19].replace("T", " ")
        t.add_row(letter["id"], when, letter["kind"], letter["attempts"], letter["task_id"], letter["reason"])
    console.print(t)
    return 0


@dead.command("show", epilog="Example:\n\n  farm dead show --agent math 1732435200000-0")
@AGENT
@click.argument("letter_id")
@pass_globals
def dead_show(g: Globals, agent, letter_id) -> int:
    """One dead letter in full, with its task, as JSON."""
    from farm.deadletters import show_dead
    from farm.transport import errors

    s, r = _open(g, agent)
    with errors(s.redis_url):
        letter = show_dead(r, s.keys, agent, letter_id, max_entry_bytes=s.max_entry_bytes)
    if letter is None:
        raise ConfigError(f"no dead letter {letter_id!r} for agent {agent!r} (see `farm dead list --agent {agent}`)")
    print(json.dumps(letter, indent=2, default=str))
    return 0


def _chosen(ids: tuple[str, ...], every: bool, verb: str) -> Optional[list[str]]:
    if every == bool(ids):
        raise ConfigError(f"give the letter ids to {verb}, or --all (not both)")
    return None if every else list(ids)


IDS = click.argument("ids", nargs=-1)
ALL = click.option("--all", "every", is_flag=True, help="every dead letter of the agent.")


def _act(g: Globals, agent: str, ids: tuple[str, ...], every: bool, verb: str) -> int:
    from farm import deadletters
    from farm.transport import errors

    s, r = _open(g, agent)
    with errors(s.redis_url):
        n = getattr(deadletters, verb)(r, s.keys, agent, _chosen(ids, every, verb))
    what = "task(s)" if verb == "requeue" else "dead letter(s)"
    print(f"{verb}d {n} {what} for {agent!r} ({_where(s)})")
    return 0


@dead.command(
    "requeue", epilog="Examples:\n\n  farm dead requeue --agent math --all\n\n  farm dead requeue --agent math ID"
)
@AGENT
@IDS
@ALL
@pass_globals
def dead_requeue(g: Globals, agent, ids, every) -> int:
    """Put dead letters back on the agent's task stream; they start over with their attempts."""
    return _act(g, agent, ids, every, "requeue")


@dead.command("purge", epilog="Examples:\n\n  farm dead purge --agent math --all\n\n  farm dead purge --agent math ID")
@AGENT
@IDS
@ALL
@pass_globals
def dead_purge(g: Globals, agent, ids, every) -> int:
    """Delete dead letters for good."""
    return _act(g, agent, ids, every, "purge")
