"""The policy stub token by token (workers/policy/stub/generate.py, engine.py): vLLM's stream shape
read by aiohttp, the tokens an abort had generated, and the engine mode's KV capacity and
preemption as /metrics reports them.

Against the real stub process with aiohttp, as the policy client reads it; a bare socket where a
test must close the connection at one exact moment.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest
from helpers.policies import stub_processes

from workers.policy.load import parse_metrics
from workers.policy.stub import Script

pytestmark = pytest.mark.slow

REPLY = [100 + i for i in range(19)] + [2]  # 20 tokens, the last EOS
SCRIPT = Script(token_replies=[REPLY], model="m", max_model_len=4096)
BODY = {"model": "m", "prompt": [1, 2, 3], "logprobs": 0, "max_tokens": 64}


@pytest.fixture
def stub(tmp_path):
    with stub_processes(SCRIPT, tmp_path, latency_s=0.2) as start:
        yield start


async def read_stream(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[aiohttp.ClientResponse, list]:
    """One streamed /v1/completions: the response and its events (decoded JSON, or "[DONE]")."""
    events: list = []
    async with http.post(url + "/v1/completions", json={**body, "stream": True}) as resp:
        async for line in resp.content:
            line = line.strip()
            if line.startswith(b"data: "):
                data = line[6:]
                events.append(data.decode() if data == b"[DONE]" else json.loads(data))
    return resp, events


async def test_a_stream_has_vllms_shape_and_the_unstreamed_replys_tokens(stub):
    s = stub()
    async with aiohttp.ClientSession() as http:
        async with http.post(s.url + "/v1/completions", json=BODY) as resp:
            whole = (await resp.json())["choices"][0]
        start = time.monotonic()
        resp, events = await read_stream(http, s.url, {**BODY, "stream_options": {"include_usage": True}})
        took = time.monotonic() - start
        again, more = await read_stream(http, s.url, BODY)  # the same kept-alive connection, read again
    assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
    assert resp.headers["Transfer-Encoding"] == "chunked"
    assert events[-1] == "[DONE]" and more[-1] == "[DONE]"
    tokens, usage = events[:-2], events[-2]
    assert len(tokens) == len(REPLY)
    for e in tokens:
        assert set(e) == {"id", "object", "created", "model", "choices"} and e["object"] == "text_completion"
        (choice,) = e["choices"]
        assert choice["text"] == "" and choice["stop_reason"] is None
        assert set(choice["logprobs"]) == {"tokens", "token_logprobs", "text_offset", "top_logprobs"}
        assert len(choice["logprobs"]["tokens"]) == 1
    assert [e["choices"][0]["logprobs"]["tokens"][0] for e in tokens] == whole["logprobs"]["tokens"]
    assert [e["choices"][0]["logprobs"]["token_logprobs"][0] for e in tokens] == whole["logprobs"]["token_logprobs"]
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * (len(REPLY) - 1) + ["stop"]
    assert usage["choices"] == [] and usage["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": len(REPLY),
        "total_tokens": 3 + len(REPLY),
    }
    assert 0.18 <= took < 0.6  # the latency drawn, spread over the tokens: the same total as unstreamed
    assert len(more) == len(REPLY) + 1  # no usage event unless asked


async def test_a_streamed_reply_cut_by_max_tokens_ends_with_length(stub):
    s = stub(latency_s=0.0)
    async with aiohttp.ClientSession() as http:
        _, events = await read_stream(http, s.url, {**BODY, "max_tokens": 5})
    assert len(events) == 6 and events[4]["choices"][0]["finish_reason"] == "length"


async def test_tokens_come_at_an_even_pace(stub):
    s = stub(per_token_s=0.05)
    arrivals = []
    async with aiohttp.ClientSession() as http:
        start = time.monotonic()
        async with http.post(s.url + "/v1/completions", json={**BODY, "stream": True, "max_tokens": 8}) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    arrivals.append(time.monotonic() - start)
    assert len(arrivals) == 8
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
    assert 0.3 <= arrivals[-1] < 0.8, arrivals  # 8 x 50 ms
    assert arrivals[0] < 0.15 and 0.03 < gaps[len(gaps) // 2] < 0.08, arrivals  # one at a time, not all at the end


def _post_raw(port: int, body: dict) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    data = json.dumps(body).encode()
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(data), data)
    )
    return sock


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("engine", [False, True])
async def test_an_abort_mid_generation_counts_the_tokens_generated_by_then(stub, stream, engine):
    # 20 tokens over 1 s: one every 50 ms (the latency drawn, spread; or 50 ms decode steps)
    s = stub(latency_s=1.0, engine=engine, step_s=0.05, step_s_per_seq=0.0)
    sock = _post_raw(s.port, {**BODY, "stream": stream})
    await asyncio.sleep(0.5)
    sock.close()
    await asyncio.sleep(0.3)
    stats = s.stats()
    assert stats["aborted"] == 1 and stats["pending"] == 0
    assert 6 <= stats["tokens_generated"] <= 14, stats  # about half of 20
    if stream:
        assert stats["tokens_delivered"] == stats["tokens_generated"]
    else:
        assert stats["tokens_delivered"] == 0  # generated, never delivered: the waste partial rollouts keep
    await asyncio.sleep(0.5)
    assert s.stats()["tokens_generated"] == stats["tokens_generated"]  # its clock stopped
    if engine:
        assert s.stats()["engine"] | {"steps": 0} == {
            "running": 0,
            "waiting": 0,
            "kv_tokens": 0,
            "kv_cache_usage": 0.0,
            "preemptions": 0,
            "steps": 0,
        }  # its KV freed


async def test_the_engine_preempts_when_the_kv_cache_is_full_and_metrics_say_so(tmp_path):
    # 20-token replies after 100-token prompts: 8 fit at admission in 1,000 tokens, not as they grow.
    with stub_processes(SCRIPT, tmp_path, latency_s=5.0) as start:
        full = start(engine=True, kv_capacity_tokens=1000, step_s=0.01, step_s_per_seq=0.0)
        roomy = start(engine=True, kv_capacity_tokens=100_000, step_s=0.01, step_s_per_seq=0.0)
        body = {**BODY, "prompt": list(range(3, 103))}
        async with aiohttp.ClientSession() as http:

            async def one(url: str) -> dict:
                async with http.post(url + "/v1/completions", json=body) as resp:
                    return await resp.json()

            calls = [asyncio.ensure_future(one(full.url)) for _ in range(16)]
            await asyncio.sleep(0.1)
            async with http.get(full.url + "/metrics") as resp:
                assert resp.headers["Content-Type"].startswith("text/plain")
                busy = parse_metrics(await resp.text())
            started = time.monotonic()
            replies = await asyncio.gather(*calls)
            took_full = time.monotonic() - started + 0.1
            started = time.monotonic()
            roomy_replies = await asyncio.gather(*[one(roomy.url) for _ in range(16)])
            took_roomy = time.monotonic() - started
            async with http.get(full.url + "/metrics") as resp:
                text = await resp.text()
        engine, roomy_engine, generated = (
            full.stats()["engine"],
            roomy.stats()["engine"],
            full.stats()["tokens_generated"],
        )
    assert all(r["choices"][0]["logprobs"]["tokens"] == [f"token_id:{i}" for i in REPLY] for r in replies)
    assert busy is not None and busy.running + busy.waiting == 16 and 1 <= busy.running <= 9
    assert busy.waiting >= 7 and busy.kv_usage > 0.8
    idle = parse_metrics(text)
    assert idle is not None and idle.running == idle.waiting == 0 and idle.kv_usage == 0.0
    assert engine["preemptions"] > 0 and idle.preemptions == engine["preemptions"]
    assert 'vllm:num_preemptions_total{engine="0",model_name="m"}' in text
    assert "# TYPE vllm:num_preemptions counter" in text
    assert roomy_engine["preemptions"] == 0
    assert len(roomy_replies) == 16
    # Latency is decode steps, not the 5 s drawn: 20 steps of 10 ms when all 16 fit at once.
    assert took_roomy < 1.0, took_roomy
    assert took_full > took_roomy
    assert generated == 16 * len(REPLY)  # a recompute regenerates nothing


async def test_engine_options_change_at_run_time_and_are_checked(stub):
    s = stub()
    assert s.control(engine=True, kv_capacity_tokens=500, max_num_seqs=2)["max_num_seqs"] == 2
    with pytest.raises(Exception, match="400"):
        s.control(max_num_seqs=0)
    async with aiohttp.ClientSession() as http:
        calls = [http.post(s.url + "/v1/completions", json=BODY) for _ in range(4)]
        await asyncio.sleep(0)
        resps = await asyncio.gather(*calls)
        for r in resps:
            assert r.status == 200
            await r.read()
    assert s.stats()["engine"]["steps"] >= 2 * len(REPLY)  # 2 at a time: two rounds of 20 steps
