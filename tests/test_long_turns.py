"""Long conversations (60 tool turns of long results): what the worker renders and hashes per turn
must not grow with the turns, and the ids stay the template's own. Counted, not timed: the CPU
figures are bench/long_turns.py's.

No model and no process: the tokens backend's conversation and the gateway's bridge are driven
with SmolLM2's real tokenizer and a scripted reply (a Hermes tool call every turn).
"""

from __future__ import annotations

from collections import Counter

import pytest
from helpers.policies import hermes

from workers.gateway.bridge import Bridge, Message
from workers.policy.chat import ChatTokenizer
from workers.policy.protocol import Turn
from workers.policy.token_policy import TokenConversation

TURNS = 60
TOOLS = [
    {
        "type": "function",
        "function": {"name": "read_chunk", "description": "Read the next chunk.", "parameters": {"type": "object"}},
    }
]
START = [{"role": "system", "content": "You read logs."}, {"role": "user", "content": "Which service failed?"}]


def result(turn: int) -> str:
    return " ".join(f"line {turn}-{i}: service timeout retry" for i in range(40))


@pytest.fixture
def fresh(model_dir):
    """A tokenizer of its own (its frames start empty), with the messages each render took, per turn."""
    tok = ChatTokenizer(str(model_dir))
    rendered: Counter = Counter()
    tok.turn = 0
    render = tok._render

    def counted(messages, tools, gen):
        rendered[tok.turn] += len(messages)
        return render(messages, tools, gen)

    tok._render = counted
    return tok, rendered


def test_the_template_renders_no_more_per_turn_as_the_conversation_grows(fresh, tokenizer):
    """Each turn's environment ids came from a frame keyed by the whole history's roles: a new frame,
    and two renders of the whole history, at every depth (quadratic in the turns)."""
    tok, rendered = fresh
    convo = TokenConversation(tok, START, TOOLS)
    reply = hermes("read_chunk")
    ids = tok.encode(reply) + [tok.eos_id]
    for turn in range(1, TURNS + 1):
        tok.turn = turn
        convo.request(turn)
        convo.add_reply(Turn(reply, [], ids=ids, logprobs=[-0.1] * len(ids)))
        history = list(convo.history)
        before = len(convo.ids)
        convo.extend([{"role": "tool", "content": result(turn)}])
        new = [{"role": "tool", "content": result(turn)}]
        want = tokenizer.encode(tokenizer._appended(history, convo.template_tools, new))
        assert convo.ids[before:] == want, f"turn {turn}: the environment's ids are the template's"
    late = sum(n for turn, n in rendered.items() if turn > 40)
    assert late == 0, f"turns 41-{TURNS} rendered {late} messages"
    assert sum(rendered.values()) < 20 * TURNS, "messages rendered in all grow with the turns, not their square"


def test_the_gateway_hashes_only_the_new_messages_of_a_resent_history(tokenizer, monkeypatch):
    """A harness sends its whole history every call; the bridge hashed every message of it every call."""
    hashed = Counter()
    key = Message.key

    def counted(self):
        hashed["n"] += 1
        return key(self)

    monkeypatch.setattr(Message, "key", counted)
    bridge = Bridge(tokenizer)
    messages = [Message(m["role"], m["content"]) for m in START]
    text = hermes("read_chunk")
    ids = tokenizer.encode(text) + [tokenizer.eos_id]
    per_call = []
    for turn in range(1, TURNS + 1):
        hashed.clear()
        plan = bridge.plan(list(messages), TOOLS)
        assert (plan.chain is None) == (turn == 1), "every call after the first extends the last reply"
        reply = Message("assistant", "", (("call_1", "read_chunk", "{}"),))
        bridge.record(plan, ids, [-0.1] * len(ids), text, reply)
        per_call.append(hashed["n"])
        messages += [reply, Message("tool", result(turn), call_id="call_1")]
    assert max(per_call[2:]) <= 3, f"messages hashed per call: {per_call}"
    assert len(bridge.segments) == 1 and bridge.retokenized() == 0
