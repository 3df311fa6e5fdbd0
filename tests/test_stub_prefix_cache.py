"""The policy stub's prefix-cache model (workers/policy/stub/prefix.py), which bench/prefill.py
leans on to count what routing costs in prefill: hits on a repeated prompt and on a shared prefix,
LRU eviction at capacity, prefill time charged per uncached token, and the counters in /stats.

Against a real stub process (StubProcess, options given as its command-line flags) over HTTP.
Each behaviour sits next to its negative control: a prompt that differs in its first block, a
prompt evicted while another survived, a cached prompt answered fast, the cache turned off.
"""

import json
import random
import time
import urllib.request

import pytest
from helpers.policies import stub_processes

from workers.policy.stub import BLOCK, Script, StubProcess

pytestmark = pytest.mark.slow

SCRIPT = Script(token_replies=[[5, 6, 2]], model="m", max_model_len=8192)


@pytest.fixture
def stub(tmp_path):
    with stub_processes(SCRIPT, tmp_path, latency_s=0.0) as start:
        yield start


def tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 30000) for _ in range(n)]


def request(s: StubProcess, prompt: list[int]) -> tuple[float, dict]:
    """One /v1/completions: (seconds it took, the answer)."""
    body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 64}).encode()
    req = urllib.request.Request(s.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=30) as resp:
        got = json.loads(resp.read())
    return time.perf_counter() - start, got


def complete(s: StubProcess, prompt: list[int]) -> tuple[float, int]:
    """One /v1/completions: (seconds it took, the cached tokens its usage reports)."""
    took, got = request(s, prompt)
    return took, got["usage"]["prompt_tokens_details"]["cached_tokens"]


def reply_ids(s: StubProcess, prompt: list[int]) -> list[int]:
    return [int(t.removeprefix("token_id:")) for t in request(s, prompt)[1]["choices"][0]["logprobs"]["tokens"]]


def test_a_repeated_prompt_is_prefilled_once_then_hit(stub):
    s = stub(prefix_cache_tokens=4096)
    prompt = tokens(4 * BLOCK + 5, seed=0)
    assert complete(s, prompt)[1] == 0
    assert complete(s, prompt)[1] == 4 * BLOCK  # the partial fifth block is computed again, as vLLM does
    exact = tokens(4 * BLOCK, seed=1)  # a prompt of whole blocks: its last token is always computed
    complete(s, exact)
    assert complete(s, exact)[1] == 3 * BLOCK


def test_a_shared_prefix_is_hit_by_a_prompt_that_extends_it(stub):
    s = stub(prefix_cache_tokens=4096)
    prefix = tokens(6 * BLOCK, seed=0)
    complete(s, prefix + tokens(7, seed=1))
    assert complete(s, prefix + tokens(40, seed=2))[1] == 6 * BLOCK
    other_head = [1] + prefix[1:]  # the negative control: the same later blocks behind another first block
    assert complete(s, other_head + tokens(40, seed=2))[1] == 0


def test_a_completion_extends_the_cached_prefix_for_the_next_turn(stub):
    """The next turn's prompt is prompt + completion + new tokens: the completion's full blocks are cached too."""
    s = stub(prefix_cache_tokens=4096)
    prompt = tokens(2 * BLOCK - 2, seed=0)  # 30 tokens + the 3-token reply: two full blocks
    complete(s, prompt)
    assert complete(s, prompt + [5, 6, 2] + tokens(20, seed=1))[1] == 2 * BLOCK


def test_capacity_evicts_the_least_recently_used_blocks(stub):
    s = stub(prefix_cache_tokens=8 * BLOCK)
    p1, p2, p3 = (tokens(4 * BLOCK + 1, seed=i) for i in range(3))  # 4 full blocks each
    complete(s, p1)
    complete(s, p2)  # the cache is full: p1's and p2's blocks
    assert complete(s, p1)[1] == 4 * BLOCK  # p1 touched: p2 is now the least recently used
    complete(s, p3)  # 4 blocks more: p2's go
    assert complete(s, p1)[1] == 4 * BLOCK
    assert complete(s, p2)[1] == 0
    stats = s.prefix_cache()
    assert stats["blocks"] == stats["capacity_blocks"] == 8
    assert stats["evicted_blocks"] == 8  # p2's four, then p3's four as p2 came back


def test_prefill_time_is_charged_per_uncached_token(stub):
    s = stub(prefix_cache_tokens=4096, prefill_s_per_token=0.001)
    prompt = tokens(25 * BLOCK + 4, seed=0)  # 404 tokens: 0.4 s to prefill
    cold, _ = complete(s, prompt)
    warm, cached = complete(s, prompt)  # 4 tokens uncached: 4 ms
    assert cached == 25 * BLOCK
    assert cold > 0.38, cold
    assert warm < 0.15, warm
    s.control(prefix_cache_tokens=0)  # off: every prompt token prefilled, every time
    again, cached = complete(s, prompt)
    assert cached == 0 and again > 0.38, again


def test_the_counters_are_in_stats(stub):
    s = stub(prefix_cache_tokens=4096)
    prompt = tokens(3 * BLOCK + 8, seed=0)
    for _ in range(3):
        complete(s, prompt)
    stats = s.stats()
    assert stats["POST /v1/completions"] == 3
    assert stats["prefix_cache"] == {
        "requests": 3,
        "prompt_tokens": 3 * len(prompt),
        "cached_tokens": 2 * 3 * BLOCK,
        "prefilled_tokens": len(prompt) + 2 * 8,
        "blocks": 3,
        "capacity_blocks": 4096 // BLOCK,
        "evicted_blocks": 0,
    }
    s.control(prefix_cache_tokens=0)
    complete(s, prompt)
    off = s.prefix_cache()
    assert off["blocks"] == 0 and off["cached_tokens"] == 2 * 3 * BLOCK and off["requests"] == 4


def test_filler_makes_the_samples_of_one_prompt_differ_and_keeps_the_script(tmp_path):
    """Scripted replies are the same for every sample of a prompt, so one sample's next turn would hit
    another's completion in the cache; filler ids in front make them differ, as sampled ones do."""
    script = Script(token_replies=[[5, 6, 2], [7, 2]], filler=list(range(100, 200)), model="m", max_model_len=8192)
    with StubProcess(script, latency_s=0.0, filler_tokens=24, seed=0, workdir=tmp_path) as s:
        prompt = tokens(40, seed=0)
        a, b = reply_ids(s, prompt), reply_ids(s, prompt)
        assert a != b and len(a) == len(b) == 27 and a[-3:] == b[-3:] == [5, 6, 2]
        assert set(a[:24]) <= set(script.filler)
        assert reply_ids(s, prompt + a + tokens(5, seed=1))[-2:] == [7, 2]  # the script moves on past the filler
        s.control(filler_tokens=0)  # the negative control: every sample the same
        assert reply_ids(s, prompt) == reply_ids(s, prompt) == [5, 6, 2]
