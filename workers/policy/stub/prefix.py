"""The stub replica's prefix cache: which prompt tokens a vLLM server would have to prefill.

A model of vLLM's automatic prefix caching, so that a benchmark can count what placing requests
on replicas costs in prefill without a GPU: token ids are cut into blocks of BLOCK (16, vLLM's
default block size), each block keyed by a chained hash of (its parent's key, its tokens), so a
key names the whole prefix up to its block's end. A prompt's cached tokens are its longest run of
leading blocks present, capped as vLLM caps them: at least the prompt's last token is computed
(so a prompt of exactly k blocks hits at most k - 1), and a partial last block is never cached.

Once a request is admitted, the full blocks of prompt + completion are inserted or touched
(vLLM caches a block as soon as it is scheduled, so the G samples of a group that arrive together
on one replica share one prefill). The cache is an LRU over blocks bounded by `capacity` tokens;
each sequence's blocks are touched last block first, so eviction takes a prefix's tail before its
head, as vLLM's free-block queue does. Unlike vLLM, a block of a request still running can be
evicted, and prefill never queues behind other requests: the model is the hit rate, not contention.

Cost: one hash and one dict operation per block, O(prompt blocks) per request; memory bounded by
capacity / BLOCK entries.
"""

from __future__ import annotations

from collections import OrderedDict

BLOCK = 16


class PrefixCache:
    """One replica's cache of token blocks, and the tokens it was asked for, found and prefilled."""

    def __init__(self, capacity_tokens: int = 0):
        self.blocks: OrderedDict[int, None] = OrderedDict()  # key -> nothing, least recently used first
        self.capacity = 0
        self.resize(capacity_tokens)
        self.requests = self.prompt_tokens = self.cached_tokens = self.evicted = 0

    def resize(self, capacity_tokens: int) -> None:
        """A new capacity, in tokens (0: off); the least recently used blocks beyond it go."""
        self.capacity = max(0, capacity_tokens) // BLOCK
        self._evict()

    def admit(self, prompt: list[int], completion: list[int]) -> int:
        """Count one request: its prompt's cached tokens (returned), then its blocks are cached."""
        self.requests += 1
        self.prompt_tokens += len(prompt)
        if not self.capacity:
            return 0
        seq = prompt + completion
        keys, parent = [], 0
        for start in range(0, len(seq) - BLOCK + 1, BLOCK):
            parent = hash((parent, *seq[start : start + BLOCK]))
            keys.append(parent)
        hits = 0
        for key in keys[: (len(prompt) - 1) // BLOCK]:
            if key not in self.blocks:
                break
            hits += 1
        blocks = self.blocks
        for key in reversed(keys):
            blocks[key] = None
            blocks.move_to_end(key)
        self._evict()
        self.cached_tokens += hits * BLOCK
        return hits * BLOCK

    def _evict(self) -> None:
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)
            self.evicted += 1

    def stats(self) -> dict[str, int]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefilled_tokens": self.prompt_tokens - self.cached_tokens,
            "blocks": len(self.blocks),
            "capacity_blocks": self.capacity,
            "evicted_blocks": self.evicted,
        }
