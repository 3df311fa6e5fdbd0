"""Policy client bookkeeping (replica choice, health, cooling, shared lookups, parsing).

Against real HTTP servers on loopback: workers/policy/stub (the latency-injecting
OpenAI-compatible stand-in) where a well-behaved server will do, and a few lines of
aiohttp.web where a test needs a server that misbehaves in one exact way. tests/test_policy.py
runs the same client against real vLLM.
"""

import asyncio
import time

import pytest
from aiohttp import web
from helpers.policies import stub_processes

from workers.policy.chat import BadToolCall, ToolCall, chat_tools, input_messages, parse_tool_calls
from workers.policy.stub import Script
from workers.policy.tokens import PolicyClient, PolicyConfig, PolicyRejected, PolicyUnavailable, Session, retry_after_s

SCRIPT = Script(token_replies=[[5, 6, 2]], model="m", max_model_len=2048)


@pytest.fixture
def stubs(tmp_path):
    with stub_processes(SCRIPT, tmp_path, latency_s=0.01) as start:
        yield start


async def serve(handler) -> tuple[str, web.AppRunner]:
    """A one-route aiohttp.web server on loopback: for answers the stub never gives."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return f"http://127.0.0.1:{runner.addresses[0][1]}", runner


@pytest.mark.slow
async def test_least_outstanding_sticky_sessions_and_health(stubs):
    a, b = stubs(), stubs()
    client = PolicyClient(PolicyConfig(urls=[a.url, b.url], model="m", probe_interval_s=0.05, health_interval_s=0.1))
    sessions = [Session() for _ in range(8)]
    for s in sessions:
        c = await client.complete([1, 2, 3], {}, s)
        assert c.ids == [5, 6, 2] and c.logprobs == pytest.approx([-0.25] * 3)
    first = {id(s): s.replica.url for s in sessions}
    for s in sessions:
        await client.complete([1], {}, s)
    assert {id(s): s.replica.url for s in sessions} == first  # each rollout stays on its replica
    assert a.stats()["status 200"] > 0 and b.stats()["status 200"] > 0
    b.control(fault=503)  # /health answers 503 too
    await asyncio.sleep(0.4)  # the health monitor notices (b served nothing for a health interval)
    assert not client.replicas[1].healthy
    for s in sessions:
        await client.complete([1], {}, s)
        assert s.replica.url == a.url
    assert sum(s.moves for s in sessions) >= 1
    b.control(fault=None)
    await asyncio.sleep(0.3)
    assert client.replicas[1].healthy
    await client.aclose()


@pytest.mark.slow
async def test_max_model_len_is_looked_up_once_per_replica(stubs):
    stub = stubs()
    client = PolicyClient(PolicyConfig(urls=[stub.url], model="m"))
    lens = await asyncio.gather(*(client.max_model_len(Session()) for _ in range(500)))
    await client.aclose()
    assert set(lens) == {2048}
    assert stub.stats()["GET /v1/models"] == 1


@pytest.mark.slow
async def test_429_with_retry_after_is_honoured(stubs):
    stub = stubs(fault=429, retry_after=1.5)
    client = PolicyClient(PolicyConfig(urls=[stub.url], model="m", retry_budget_s=30))
    start = time.monotonic()
    call = asyncio.create_task(client.complete([1], {}, Session()))
    await asyncio.sleep(0.3)
    stub.control(fault=None)  # answers again, but the client must keep away until Retry-After passes
    assert not client.ready() and not client.replicas[0].ready(time.monotonic())
    await asyncio.sleep(0.7)
    assert stub.stats()["POST /v1/completions"] == 1, "no request while the replica cools"
    c = await asyncio.wait_for(call, 10)
    assert c.ids == [5, 6, 2] and time.monotonic() - start >= 1.4
    assert stub.stats()["POST /v1/completions"] == 2 and client.ready()
    await client.aclose()


@pytest.mark.slow
async def test_cooling_replica_sends_requests_to_the_other(stubs):
    a, b = stubs(fault=429, retry_after=30), stubs()
    client = PolicyClient(PolicyConfig(urls=[a.url, b.url], model="m"))
    s = Session(replica=client.replicas[0])
    for _ in range(5):
        await client.complete([1], {}, s)
    await client.aclose()
    assert a.stats()["POST /v1/completions"] == 1 and b.stats()["POST /v1/completions"] == 5
    assert s.replica.url == b.url and s.moves == 1


@pytest.mark.slow
async def test_budget_spent_on_a_dead_server_is_a_policy_failure_with_the_reason(stubs):
    stub = stubs()
    stub.stop()
    client = PolicyClient(PolicyConfig(urls=[stub.url], model="m", retry_budget_s=1.0, backoff_s=0.05))
    start = time.monotonic()
    with pytest.raises(PolicyUnavailable, match=r"1s retry budget.*ClientConnectorError") as info:
        await client.complete([1], {}, Session())
    assert time.monotonic() - start < 10
    assert info.value.kind == "policy" and not info.value.retryable
    assert not client.ready()  # out of rotation: the worker would stop fetching
    await client.aclose()


@pytest.mark.slow
async def test_unreadable_or_inconsistent_completions_are_rejected():
    bodies = iter(
        [
            {"choices": []},
            {"choices": [{"logprobs": {"tokens": ["token_id:1", "token_id:2"], "token_logprobs": [-1.0]}}]},
        ]
    )

    async def handler(request):
        return web.json_response(next(bodies))

    url, runner = await serve(handler)
    client = PolicyClient(PolicyConfig(urls=[url], model="m"))
    with pytest.raises(PolicyRejected, match="unreadable"):
        await client.complete([1], {}, Session())
    with pytest.raises(PolicyRejected, match="2 token ids but 1 logprobs"):
        await client.complete([1], {}, Session())
    await client.aclose()
    await runner.cleanup()


@pytest.mark.slow
async def test_client_errors_are_not_retried():
    calls = []

    async def handler(request):
        calls.append(1)
        return web.Response(status=422, text="bad field")

    url, runner = await serve(handler)
    client = PolicyClient(PolicyConfig(urls=[url], model="m"))
    with pytest.raises(PolicyRejected, match="HTTP 422"):
        await client.complete([1], {}, Session())
    assert len(calls) == 1
    await client.aclose()
    await runner.cleanup()


def test_retry_after_header_forms():
    assert retry_after_s("2.5") == 2.5 and retry_after_s(None) is None and retry_after_s("soon") is None
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 < retry_after_s(when) <= 30


def test_parse_tool_calls():
    calls = parse_tool_calls(
        'a <tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
        '<tool_call>[1]</tool_call><tool_call>{"name": "g", "arguments": 3}</tool_call>',
        2,
    )
    assert isinstance(calls[0], ToolCall) and calls[0].arguments == {"x": 1} and calls[0].call_id == "call_2_0"
    assert isinstance(calls[1], BadToolCall) and "must be" in calls[1].error
    assert isinstance(calls[2], BadToolCall) and "JSON object" in calls[2].error
    assert parse_tool_calls("no calls here", 0) == []


def test_rows_in_nemo_gym_format_become_messages_and_tools():
    params = {
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": "sys"},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "hi "}, {"type": "input_text", "text": "there"}],
            },
        ],
        "tools": [{"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}],
    }
    assert input_messages(params) == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi there"},
    ]
    assert chat_tools(params["tools"]) == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
    ]
    assert input_messages({"input": "plain"}) == [{"role": "user", "content": "plain"}]
    with pytest.raises(ValueError, match="without a role"):
        input_messages({"input": [{"content": "x"}]})


def test_template_frames_give_the_template_text(tokenizer):
    """Prompt and environment ids from cached frames equal the full template's, row after row."""
    system = [{"role": "system", "content": "You are terse."}]
    for i in range(20):
        question = f"What is {i} + {i}?" if i % 3 else f"  odd <b>{i}</b> spacing "
        messages = system + [{"role": "user", "content": question}]
        want = tokenizer.encode(tokenizer._render(messages, None, True))
        assert tokenizer.prompt_ids(messages, None) == want
        history = messages + [{"role": "assistant", "content": f"Answer {i}"}]
        new = [{"role": "tool", "content": f'{{"sum": {2 * i}}}'}, {"role": "user", "content": f"Next {i}"}]
        assert tokenizer.append_ids(history, None, new) == tokenizer.encode(tokenizer._appended(history, None, new))
    framed = {k[0] for k, v in tokenizer._frames.items() if v is not None}
    assert framed == {"prompt", "append"}, "the frames served these texts, not the fallback"


def test_a_template_that_looks_at_contents_loses_its_frame(model_dir):
    from workers.policy.chat import ChatTokenizer

    tok = ChatTokenizer(str(model_dir))
    tok.tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content|length > 20 %}LONG {% endif %}"
        "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "a question longer than twenty"}]
    ids = tok.prompt_ids(messages, None)
    assert tok.decode(ids).count("LONG") == 1 and ids == tok.encode(tok._render(messages, None, True))
    assert [v for k, v in tok._frames.items() if k[0] == "prompt"] == [None]  # dropped for good
    short = [messages[0], {"role": "user", "content": "short"}]
    assert tok.prompt_ids(short, None) == tok.encode(tok._render(short, None, True))


def test_ids_and_text_equal_transformers_own(tokenizer, model_dir):
    """The worker calls the Rust tokenizer directly (a third cheaper than through transformers); its
    ids and text must stay transformers' own, and any configuration the direct call would not honour
    (here truncation) sends it back through transformers."""
    from workers.policy.chat import ChatTokenizer, _rust_tokenizer

    hf = tokenizer.tok
    texts = [
        "",
        "plain words",
        "  edge spaces \n\n",
        '<|im_start|>tool\n{"city": "Paris", "temperature_c": 12}<|im_end|>\n<|im_start|>assistant\n',
        "<|im_end|><|im_end|>unicode: café, 東京, 🙂 <tool_call>{}</tool_call>",
        "<|endoftext|> and <|im_start|> spelled inside text",
    ]
    assert tokenizer._rust is not None, "SmolLM2's fast tokenizer takes the direct path"
    for text in texts:
        ids = hf.encode(text, add_special_tokens=False)
        assert tokenizer.encode(text) == ids
        assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=False)
    truncating = ChatTokenizer(str(model_dir))
    truncating.tok.backend_tokenizer.enable_truncation(max_length=4)
    truncating._rust = _rust_tokenizer(truncating.tok)
    assert truncating._rust is None
    assert truncating.encode(texts[3]) == hf.encode(texts[3], add_special_tokens=False)
