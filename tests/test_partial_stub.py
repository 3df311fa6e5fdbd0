"""The tokens client streaming from the policy stub: a turn interrupted mid-stream keeps the ids
received so far, and the stub, sent them back as the end of a prompt, goes on with the rest of the
same reply, in the rest of the time; what it generated for the interrupted request is counted."""

from __future__ import annotations

import asyncio
import time

import pytest

from workers.policy.rotation import Session
from workers.policy.stub import StubProcess, weather_script
from workers.policy.tokens import PolicyClient, PolicyConfig, Sink

pytestmark = pytest.mark.slow


async def test_a_streamed_turn_cut_midway_is_continued_by_the_stub_with_the_same_reply(tokenizer, tmp_path):
    script = weather_script(tokenizer)
    reply = script.token_replies[0]
    stub = StubProcess(script, latency_s=2.0, workdir=tmp_path).start()
    client = PolicyClient(PolicyConfig(urls=[stub.url], model="stub", stream=True))
    prompt = tokenizer.encode("What is the weather in Paris?")
    try:
        sink = Sink()
        call = asyncio.ensure_future(client.complete(prompt, {"max_tokens": 64}, Session(), sink=sink))
        while len(sink.ids) < len(reply) // 2:
            await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        kept = list(sink.ids)
        assert kept == reply[: len(kept)] and 0 < len(kept) < len(reply)
        assert sink.logprobs == [script.token_logprob] * len(kept)
        await asyncio.sleep(0.3)
        stats = stub.stats()
        assert stats["aborted"] == 1 and len(kept) <= stats["tokens_generated"] <= len(kept) + 3

        t0 = time.perf_counter()
        rest = await client.complete(prompt + kept, {"max_tokens": 64}, Session(), sink=Sink())
        took = time.perf_counter() - t0
        assert kept + rest.ids == reply, "the same reply, token-exactly"
        assert took < 2.0 * (len(reply) - len(kept)) / len(reply) + 0.5, "the rest of the time, not all of it"
        fresh = await client.complete(prompt, {"max_tokens": 64}, Session())
        assert fresh.ids == reply, "an unstreamed request is answered whole, as before"
    finally:
        await client.aclose()
        stub.stop()
