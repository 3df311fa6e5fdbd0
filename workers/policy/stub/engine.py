"""The stub's engine mode: continuous batching with a KV cache that fills, as vLLM schedules.

Off by default (`engine`); on, a completion's latency is no longer drawn: it is the decode steps
it takes. One scheduler loop runs while any request is running or waiting. Each step

  1. makes room: every running sequence is about to hold one more token; while their sum
     would exceed `kv_capacity_tokens`, the newest running sequence is preempted (its KV
     dropped; it goes back to the front of the queue and must prefill its prompt and the
     tokens it had generated again, as vLLM's recompute preemption), and counted;
  2. admits (only in a step that preempted nothing, as vLLM's scheduler): waiting sequences in
     order while fewer than `max_num_seqs` run and the KV cache holds what each must prefill;
  3. takes `step_s + step_s_per_seq x running + prefill_s_per_token x tokens prefilled`
     (so throughput rises with the batch, and a recompute costs everyone), after which every
     running sequence has one more token.

Per step the work is O(running), with no per-request timers: thousands of requests in flight
cost a list entry each. `/metrics` reports what vLLM's would (`running`, `waiting`,
`usage()`, `preemptions`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Optional

from workers.policy.stub.generate import Generation, HttpProtocol

if TYPE_CHECKING:
    from workers.policy.stub.model import State


class Seq(Generation):
    """A request in the engine: the KV it holds and what it must prefill to (re)join the batch."""

    __slots__ = ("engine", "prompt", "uncached", "kv", "gone")

    def __init__(self, proto: HttpProtocol, rid: int, reply: dict, stream: bool, usage: bool, engine: Engine):
        super().__init__(proto, rid, reply, stream, usage)
        usage_ = reply.get("usage") or {}
        self.engine = engine
        self.prompt = int(usage_.get("prompt_tokens", 0))
        cached = int((usage_.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        self.uncached = self.prompt - cached  # the first prefill's tokens; a recompute prefills all
        self.kv = 0  # tokens held in the KV cache (0 while waiting)
        self.gone = False
        engine.add(self)

    def cancel(self) -> None:
        self.engine.drop(self)


class Engine:
    def __init__(self, state: State):
        self.state = state
        self.running: list[Seq] = []  # admission order: the newest is preempted first
        self.waiting: deque[Seq] = deque()
        self.n_running = self.n_waiting = 0  # live ones (a dropped sequence leaves the lists lazily)
        self.used = 0  # KV tokens held by running sequences
        self.preemptions = 0
        self.steps = 0
        self._timer: Optional[asyncio.Handle] = None
        self._batch: list[Seq] = []  # the sequences the step in progress advances

    # -- requests in and out -------------------------------------------------------------------
    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)
        self.n_waiting += 1
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_soon(self._step)

    def drop(self, seq: Seq) -> None:
        """A request whose client left: its KV is freed now, its list entry at the next step."""
        if seq.gone:
            return
        seq.gone = True
        if seq.kv:  # running (a prompt is never empty, so a running sequence holds some KV)
            self.used -= seq.kv
            seq.kv = 0
            self.n_running -= 1
        else:
            self.n_waiting -= 1

    # -- the scheduler ---------------------------------------------------------------------------
    def _step(self) -> None:
        """End the step in progress (one more token for each sequence in it), then plan the next."""
        self._timer = None
        for seq in self._batch:
            if seq.gone:
                continue
            seq.kv += 1
            self.used += 1
            seq.advance(seq.made + 1)
            if seq.made >= seq.n:
                seq.gone = True
                self.used -= seq.kv
                seq.kv = 0
                self.n_running -= 1
        self._batch = []
        o = self.state.o
        cap = o.kv_capacity_tokens or float("inf")
        running = [s for s in self.running if not s.gone]
        need = self.used + len(running)  # each running sequence is about to hold one more token
        preempted = False
        while len(running) > 1 and need > cap:
            victim = running.pop()
            need -= victim.kv + 1
            self.used -= victim.kv
            victim.kv = 0
            self.waiting.appendleft(victim)
            self.n_running -= 1
            self.n_waiting += 1
            self.preemptions += 1
            preempted = True
        prefill = 0
        while not preempted and self.waiting and len(running) < o.max_num_seqs:
            seq = self.waiting[0]
            if seq.gone:
                self.waiting.popleft()
                continue
            size = seq.prompt + seq.made  # what it must hold, and prefill, to join
            if running and need + size + 1 > cap:
                break
            self.waiting.popleft()
            prefill += size if seq.uncached < 0 else seq.uncached
            seq.uncached = -1  # any later prefill is a recompute of everything
            seq.kv = size
            self.used += size
            need += size + 1
            running.append(seq)
            self.n_waiting -= 1
            self.n_running += 1
        self.running = running
        if not running:
            return
        self.steps += 1
        self._batch = list(running)
        took = o.step_s + o.step_s_per_seq * len(running) + o.prefill_s_per_token * prefill
        self._timer = asyncio.get_running_loop().call_later(took, self._step)

    # -- what /metrics reports ------------------------------------------------------------------
    def usage(self) -> float:
        cap = self.state.o.kv_capacity_tokens
        return min(1.0, self.used / cap) if cap else 0.0

    def stats(self) -> dict:
        return {
            "running": self.n_running,
            "waiting": self.n_waiting,
            "kv_tokens": self.used,
            "kv_cache_usage": self.usage(),
            "preemptions": self.preemptions,
            "steps": self.steps,
        }
