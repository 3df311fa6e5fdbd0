"""Long conversations: the worker's CPU per model call at turn 1, 10, 50 (and 100) of one rollout.

Agentic rollouts run 30-100 turns with long tool outputs. Whatever the worker re-renders,
re-tokenizes, re-matches or copies over the whole history on every call grows with the square
of the turns; the target is a call at turn 50 costing at most 2x a call at turn 1. Two paths,
side by side in one run, against the same policy stub:

  native    the agent loop (workers/loops/loop.py) over the tokens backend (TokenPolicy, the
            chat template, the token trace, PolicyClient over HTTP), one tool call per turn;
  gateway   an agent the farm never saw, calling the gateway's /v1/chat/completions with the
            whole message history every time (what an openai-SDK harness sends); the gateway
            matches it against the chains it recorded (workers/gateway/bridge.py) and calls
            the policy through the same token path.

The model is workers/policy/stub in a process of its own (`StubProcess`, --pick random over one
token reply: a Hermes tool call, every turn, so a conversation runs as long as max_steps), with
max_model_len 262,144 so nothing is cut. Each tool result is 1,000 tokens of plain words (each
turn's different), so turn 50's prompt holds ~52,000 tokens.

Method. CPU is `time.process_time()` of this process, which runs the worker's side only: the
stub is another process and its time is not counted, and while a call waits on the stub this
process is idle. Native: the CPU between one model call's start (TokenPolicy.turn) and the
next one's, i.e. one whole turn of the worker: the request ids, the HTTP call and its JSON,
decoding and parsing the reply, adding it to the trace, the tool call, and the tool result
rendered and tokenized into the trace. Gateway: the CPU of `Gateway.handle` for one request
body, which the aiohttp server and the in-process transport both call: decoding the body,
matching the history, the prompt, the policy call, the answer. So that turn k holds the same
work on both paths (one model call, one 1,000-token tool result rendered and tokenized), the
gateway's turn k is its call k+1, the first to carry tool result k; its call 1 carries none (two
short messages) and is not a turn here. The harness's own work
(encoding its history as JSON, reading the answer) is outside the timed span; so is aiohttp's
HTTP parsing of the request (C code, linear in the body, as is the JSON decoding measured here).

Each row is the median over --rollouts rollouts in a fresh process. The chat template's frames
(workers/policy/chat.py) are checked against a full render on their first uses, so the first
rollouts of a worker can cost more than later ones: `first` is the process's first rollout,
`steady` the median of the rollouts after --warmup more.

    python bench/long_turns.py [--turns 1,10,50,100] [--rollouts 5] [--warmup 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from envs.sdk import AgentSettings, Environment, Toolset, Transcript, Verdict  # noqa: E402
from farm.schema import Sampling, Task  # noqa: E402
from workers.gateway.bridge import Bridge  # noqa: E402
from workers.gateway.calls import Limits, RolloutCalls  # noqa: E402
from workers.gateway.server import Gateway  # noqa: E402
from workers.loops.context import AgentContext  # noqa: E402
from workers.loops.loop import AgentLoop  # noqa: E402
from workers.policy.chat import ChatTokenizer  # noqa: E402
from workers.policy.config import PolicyConfig  # noqa: E402
from workers.policy.rotation import Session  # noqa: E402
from workers.policy.serving import default_cache, prepare_model  # noqa: E402
from workers.policy.stub import Script, StubProcess  # noqa: E402
from workers.policy.tokens import PolicyClient  # noqa: E402

CALL = '<tool_call>\n{"name": "read_chunk", "arguments": {}}\n</tool_call>'
SYSTEM = "You are a log analyst. Read the log chunk by chunk with read_chunk before you answer."
QUESTION = "Which service failed first in this log?"
TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "read_chunk",
        "description": "Read the next chunk of the log.",
        "parameters": {"type": "object", "properties": {}},
    },
}
WORDS = "service request timeout retry worker queue database cache error warning latency shard node".split()
TARGET = 2.0
_encode = msgspec.json.Encoder().encode

TOOLS = Toolset()


@TOOLS.tool
async def read_chunk(state: dict) -> str:
    """Read the next chunk of the log."""
    state["read"] += 1
    return state["outputs"][state["read"] - 1]


class LongLog(Environment):
    """A tool that answers 1,000 tokens every turn; the verifier is not what this measures."""

    name = "long_turns"
    verifier_version = "1"
    agent = AgentSettings(loop="tool_use")
    toolset = TOOLS

    def __init__(self, outputs: list[str]):
        self.outputs = outputs

    def new_state(self, row: Any) -> dict:
        return {"read": 0, "outputs": self.outputs}

    async def verify(self, row: Any, state: dict, transcript: Transcript) -> Verdict:
        return Verdict(reward=0.0)


def tool_outputs(tok: ChatTokenizer, n: int, tokens: int) -> list[str]:
    """n texts of plain words, `tokens` tokens each (to a few), each turn's different."""
    out = []
    for i in range(n):
        rng = random.Random(i)
        words = [f"{rng.choice(WORDS)}-{rng.randrange(1000)}" for _ in range(tokens // 3)]
        while len(tok.encode(" ".join(words))) < tokens:
            words.append(rng.choice(WORDS))
        out.append(" ".join(words))
    return out


def row() -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    return {"responses_create_params": {"input": messages, "tools": [TOOL_SCHEMA]}}


async def native(url: str, tok: ChatTokenizer, outputs: list[str], calls: int) -> list[float]:
    """CPU seconds of each turn of one native rollout (the last call's turn is not complete: left out)."""
    client = PolicyClient(PolicyConfig(urls=[url], model="stub"))
    loop = AgentLoop.over_tokens(
        LongLog(outputs), client, tok, AgentSettings(loop="tool_use", max_steps=calls + 1, sampling={})
    )
    starts: list[float] = []
    turn = loop.policy.turn

    async def timed(*args: Any) -> Any:
        starts.append(time.process_time())
        return await turn(*args)

    loop.policy.turn = timed  # type: ignore[method-assign,assignment]
    task = Task.new(run_id="b", agent="a", row=row(), reply_to="-", sampling=Sampling(max_tokens=64))
    try:
        rollout = await loop.run(task, AgentContext("bench", None))  # type: ignore[arg-type]
    finally:
        await client.aclose()
    assert rollout.ok, rollout.error
    return [b - a for a, b in zip(starts, starts[1:])]


async def gateway(url: str, tok: ChatTokenizer, outputs: list[str], calls: int) -> list[float]:
    """CPU seconds of turns 1..calls-1: each chat-completions call after the first, which carries
    the newest tool result (the first call carries none); every call sends the whole history."""
    client = PolicyClient(PolicyConfig(urls=[url], model="stub"))
    gw = Gateway(client, tok)

    async def no_tool(name: str, args: dict) -> str:
        return ""

    rollout = gw.open(
        RolloutCalls(
            model="stub",
            sampling={"max_tokens": 64},
            limits=Limits(calls + 1),
            session=Session(),
            bridge=Bridge(tok),
            run_tool=no_tool,
            task_json={},
        )
    )
    path = f"/r/{rollout.secret}/v1/chat/completions"
    messages: list[dict] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    costs = []
    try:
        for i in range(calls):
            body = _encode({"model": "stub", "messages": messages, "tools": [TOOL_SCHEMA]})
            t0 = time.process_time()
            answer = await gw.handle("POST", path, "", body)
            costs.append(time.process_time() - t0)
            assert answer.status == 200, answer.body[:300]
            message = msgspec.json.decode(answer.body)["choices"][0]["message"]
            result = {"role": "tool", "tool_call_id": message["tool_calls"][0]["id"], "content": outputs[i]}
            messages += [message, result]
    finally:
        gw.close(rollout)
        await client.aclose()
    return costs[1:]


def measure(path: str, url: str, tok: ChatTokenizer, outputs: list[str], a: argparse.Namespace) -> dict:
    run = native if path == "native" else gateway
    calls = max(a.turns) + 1
    rounds = [asyncio.run(run(url, tok, outputs, calls)) for _ in range(1 + a.warmup + a.rollouts)]
    first, steady = rounds[0], rounds[1 + a.warmup :]
    return {
        "first": [first[t - 1] for t in a.turns],
        "steady": [statistics.median(r[t - 1] for r in steady) for t in a.turns],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", default="1,10,50,100", help="the turns to report (1 and 50 give the ratio)")
    p.add_argument("--rollouts", type=int, default=5, help="steady rollouts per path (the median is printed)")
    p.add_argument("--warmup", type=int, default=8, help="rollouts between the first and the steady ones")
    p.add_argument("--tool-tokens", type=int, default=1000)
    p.add_argument("--paths", default="native,gateway")
    a = p.parse_args()
    a.turns = sorted({int(t) for t in a.turns.split(",")} | {1, 50})
    tok = ChatTokenizer(str(prepare_model(default_cache())))
    outputs = tool_outputs(tok, max(a.turns) + 1, a.tool_tokens)
    script = Script(token_replies=[tok.encode(CALL) + [tok.eos_id]], model="stub", max_model_len=262_144)
    results = {}
    t0 = time.perf_counter()
    with StubProcess(script, latency_s=0.0, pick="random", seed=0) as stub:
        for path in a.paths.split(","):
            results[path] = measure(path, stub.url, tok, outputs, a)
    elapsed = time.perf_counter() - t0
    i50 = a.turns.index(50)
    print(f"bench/long_turns.py  {time.strftime('%Y-%m-%d')}  {platform.machine()}, {os.cpu_count()} cores")
    print(
        f"worker CPU ms per model call; tool results of {a.tool_tokens} tokens; first rollout of the process, "
        f"and the median of {a.rollouts} after {a.warmup} more  ({elapsed:.0f}s)"
    )
    head = "".join(f"{'turn ' + str(t):>11}" for t in a.turns)
    print(f"{'path':<18}{head}{'50/1':>9}  target <= {TARGET:g}x")
    for path, r in results.items():
        for kind in ("first", "steady"):
            ms = r[kind]
            ratio = ms[i50] / ms[0]
            cells = "".join(f"{x * 1e3:>11.2f}" for x in ms)
            verdict = "ok" if ratio <= TARGET else "over"
            print(f"{path + ' ' + kind:<18}{cells}{ratio:>8.2f}x  {verdict}")


if __name__ == "__main__":
    main()
