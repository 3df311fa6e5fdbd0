"""The policy stub's own features, which the step-time benchmark leans on: heavy-tailed latency,
aborts seen as the client closes its connection, and random replies for reward variance.

Against the real stub process (workers.policy.stub.StubProcess) with real HTTP clients: aiohttp,
as the worker's policy client, and a bare socket where a test needs to close the connection at one
exact moment. Each feature is checked next to its negative control (fixed latency, an answered
request, the scripted order).
"""

import asyncio
import json
import socket
import time

import aiohttp
import pytest
from helpers.policies import stub_processes

from workers.policy.stub import Script, StubProcess

pytestmark = pytest.mark.slow

A, B = [5, 6, 2], [7, 2]
SCRIPT = Script(token_replies=[A, B], model="m", max_model_len=2048)
BODY = json.dumps({"model": "m", "prompt": [1, 2, 3], "max_tokens": 16}).encode()


@pytest.fixture
def stub(tmp_path):
    with stub_processes(SCRIPT, tmp_path, latency_s=0.0) as start:
        yield start


async def complete(http: aiohttp.ClientSession, url: str) -> tuple[float, list[int]]:
    """One /v1/completions: (seconds it took, the token ids answered)."""
    start = time.perf_counter()
    async with http.post(url + "/v1/completions", data=BODY, headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 200
        got = await resp.json()
    ids = [int(t.removeprefix("token_id:")) for t in got["choices"][0]["logprobs"]["tokens"]]
    return time.perf_counter() - start, ids


async def quantiles(http: aiohttp.ClientSession, url: str, n: int, qs: tuple[float, ...]) -> list[float]:
    """The qs-quantiles of n concurrent requests' latencies; the requests slower than the largest
    quantile are cancelled, not waited for (the tail of a lognormal is long)."""
    calls = [asyncio.create_task(complete(http, url)) for _ in range(n)]
    got = []
    for call in asyncio.as_completed(calls):
        got.append((await call)[0])
        if len(got) > max(qs) * n:
            break
    for c in calls:
        c.cancel()
    await asyncio.gather(*calls, return_exceptions=True)
    got.sort()
    return [got[int(q * n)] for q in qs]


async def test_lognormal_latency_has_the_median_and_a_heavy_tail(stub):
    s = stub(latency_s=0.0, latency_dist="lognormal", sigma=1.0, seed=0)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=100)) as http:
        await asyncio.gather(*(complete(http, s.url) for _ in range(100)))  # open the connections first
        s.control(latency_s=0.3)
        median, p90 = await quantiles(http, s.url, 100, (0.5, 0.9))
        assert 0.25 < median < 0.45, median  # 0.3 s, plus the client's own time for 100 requests at once
        assert 2.5 < p90 / median < 5, (median, p90)  # lognormal sigma 1: p90 = e^1.28 = 3.6 x the median
        s.control(latency_dist="fixed")  # the negative control: one latency, no tail
        median, p90 = await quantiles(http, s.url, 100, (0.5, 0.9))
        assert 0.29 < median and p90 / median < 1.3, (median, p90)


def raw_request(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: stub\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
        + BODY
    )
    return sock


def wait_for(check, timeout_s: float, every_s: float = 0.005):
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        if time.monotonic() > deadline:
            return got
        time.sleep(every_s)
    return got


async def test_a_closed_connection_is_an_abort_within_100ms(stub):
    s = stub(latency_s=0.01)
    sock = raw_request(s.port)  # the negative control: answered, then closed, is no abort
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.close()
    time.sleep(0.05)
    assert s.stats()["aborted"] == 0 and s.aborts() == []

    s.control(latency_s=30.0)
    sock = raw_request(s.port)
    assert wait_for(lambda: s.stats()["pending"] == 1, 5.0)
    closed_at = time.time()
    sock.close()
    stats = wait_for(lambda: (st := s.stats())["aborted"] == 1 and st, 0.1)
    assert stats and stats["pending"] == 0, stats
    [abort] = s.aborts()
    assert abort["received"] < closed_at <= abort["closed"] < closed_at + 0.1

    async with aiohttp.ClientSession() as http:  # the worker's client: a cancelled request closes its connection
        calls = [asyncio.create_task(complete(http, s.url)) for _ in range(20)]
        await asyncio.to_thread(wait_for, lambda: s.stats()["pending"] == 20, 5.0)
        cancelled_at = time.time()
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
    assert await asyncio.to_thread(wait_for, lambda: s.stats()["aborted"] == 21, 0.1)
    late = [a["closed"] - cancelled_at for a in s.aborts()[1:]]
    assert len(late) == 20 and 0 <= min(late) and max(late) < 0.1
    assert s.stats()["pending"] == 0


async def test_random_pick_gives_every_reply_reproducibly(stub):
    async def replies(s: StubProcess, n: int) -> list[list[int]]:
        async with aiohttp.ClientSession() as http:
            return [(await complete(http, s.url))[1] for _ in range(n)]  # in turn, so the draws keep their order

    scripted = stub()
    assert await replies(scripted, 10) == [A] * 10  # the negative control: the first reply not in the prompt
    one, two = stub(pick="random", seed=7), stub(pick="random", seed=7)
    got = await replies(one, 40)
    assert {tuple(r) for r in got} == {tuple(A), tuple(B)}
    assert got == await replies(two, 40)  # the same seed, the same answers
    one.control(weights=[0, 1])
    assert await replies(one, 10) == [B] * 10
    skewed = stub(pick="random", seed=1, weights=[3, 1])
    assert 0.6 < sum(r == A for r in await replies(skewed, 200)) / 200 < 0.9
