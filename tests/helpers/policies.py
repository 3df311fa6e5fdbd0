"""Stand-ins for the model: a scripted policy in this process (SmolLM2 rarely calls tools right),
the tool call as the model writes it, and policy stub processes (workers/policy/stub)."""

from __future__ import annotations

import asyncio
import contextlib
import json


class ScriptedPolicy:
    """Stands in for vLLM (SmolLM2 rarely calls tools correctly): answers each turn with the next
    scripted text, its token ids exact, so the real agent loop and tokenizer run as with a model."""

    def __init__(self, tokenizer, turns: list[str]):
        self.tok, self.turns = tokenizer, list(turns)

    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session):
        from workers.policy.tokens import Completion

        ids = self.tok.encode(self.turns.pop(0)) + [self.tok.eos_id]
        return Completion(ids, [-0.1] * len(ids), "", "stop", "scripted", 0.0)

    async def aclose(self):
        return None


class StreamingScript:
    """Streams each scripted turn's ids into the sink one by one; `start` = (turn, ids already
    given) makes it the model of a continuation, which must be asked with those ids in its prompt."""

    streams = True

    def __init__(self, tokenizer, turns, start=(0, 0), pause_at=None):
        self.tok = tokenizer
        self.turns = [tokenizer.encode(t) + [tokenizer.eos_id] for t in turns]
        self.turn, self.skip = start
        self.pause_at = pause_at  # (turn, ids): set `paused` once that many ids of that turn went out
        self.paused = asyncio.Event()
        self.prompts: list[list[int]] = []

    async def max_model_len(self, session):
        return None

    async def complete(self, prompt_ids, sampling, session, sink=None):
        from workers.policy.tokens import Completion

        ids = self.turns[self.turn]
        done = self.skip
        assert prompt_ids[len(prompt_ids) - done :] == ids[:done] or done == 0, "continued from the given ids"
        self.prompts.append(list(prompt_ids))
        for i, tid in enumerate(ids[done:], start=done):
            sink.ids.append(tid)
            sink.logprobs.append(-0.5)
            sink.versions.append(sink.stamp())
            if self.pause_at == (self.turn, i + 1):
                self.paused.set()
                await asyncio.sleep(3600)
            await asyncio.sleep(0)
        out = ids[done:]
        self.turn, self.skip = self.turn + 1, 0
        return Completion(out, [-0.5] * len(out), "", "stop", "scripted", 0.0)

    async def aclose(self):
        return None


class Versions:
    """The served policy version as a worker's PolicyVersions watch reports it (`live`)."""

    def __init__(self, live):
        self.live = live

    def mark(self):
        return None

    def span(self, mark):
        return self.live, None


def hermes(name: str, arguments: dict | None = None) -> str:
    """A tool call as SmolLM2's (Hermes-style) chat template has the model write it."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments or {}})}</tool_call>"


@contextlib.contextmanager
def stub_processes(script, workdir, **defaults):
    """A function starting policy stubs (workers/policy/stub) of `script`; all stopped at the end.
    They are processes: a test that uses this is `slow`."""
    from workers.policy.stub import StubProcess

    started: list = []

    def start(**kw):
        stub = StubProcess(script, workdir=workdir, **{**defaults, **kw}).start()
        started.append(stub)
        return stub

    try:
        yield start
    finally:
        for stub in started:
            stub.stop()
