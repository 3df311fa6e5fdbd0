"""code_gen: write a small Python function; hidden unit tests decide the reward.

Data: 26 problem families (envs/code_families.py: clamp, caesar shift, chunking, primes, ...), each
varied by a seed-drawn parameter (the shift, the bounds, the chunk size) and tested on
seed-drawn inputs. Expected outputs come from the family's reference solution, so a row's
tests and its reference always agree. Rows carry NeMo Gym code_gen's
`verifier_metadata.unit_tests` in LiveCodeBench's call-based shape ({inputs, outputs,
fn_name}; stdin/stdout rows without fn_name, as NeMo Gym exports them, verify too).

Verifier: the last ```python block of the answer runs in envs.sandbox (its own uid and
namespaces, no network, a read-only host, CPU/memory/process/file/output limits, a wall
clock), as an rq job with rq's JSON serializer. The program sees only the test inputs and
returns its outputs; they are compared with the expected outputs here, outside the sandbox.
The reward is NeMo Gym's: 1 only when every test passes (reward="all", the default), or the
fraction passed (reward="fraction"). A program that hits a limit or does not load scores 0,
with the reason (`timeout`, `memory`, `output_limit`, `killed`, `error`) in the rollout's
metrics as `failure_kind`. The sandbox machinery failing is a `sandbox_error` failure of the
rollout, never a 0.

The sandbox's queue and workers: by default this environment starts, on first use, a
password-protected redis-server of its own for the queue and `sandbox_workers` rq workers
(so `farm worker --agent code_gen` works alone on a laptop, and the farm's task Redis never
carries sandbox jobs). `sandbox_redis_url` (with `queue`) points it at a dedicated sandbox
Redis served by `FARM_SANDBOX_REDIS_URL=... python -m envs.sandbox worker` on other hosts.
"""

from __future__ import annotations

import asyncio
import atexit
import re
from typing import Any, Literal, Optional

import msgspec

from envs.code_families import generate
from envs.sandbox import Limits, SandboxClient, SandboxError
from envs.sdk import AgentSettings, Environment, ErrorKind, RolloutFailure, Row, Transcript, Verdict

WAIT_MARGIN_S = 30.0  # queue wait allowed on top of the program's wall clock


_BLOCK = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.S)


def extract_code(text: str) -> Optional[str]:
    """The last ```python (or ```py) block; failing that, the last unlabelled ``` block."""
    blocks = [(lang.lower(), body) for lang, body in _BLOCK.findall(text)]
    for wanted in (("python", "py", "python3"), ("",)):
        found = [body for lang, body in blocks if lang in wanted]
        if found and found[-1].strip():
            return found[-1]
    return None


class UnitTests(msgspec.Struct, kw_only=True):
    """NeMo Gym's unit tests: stdin/stdout pairs, or call-based when `fn_name` is given."""

    inputs: list[str]
    outputs: list[str]
    fn_name: Optional[str] = None

    def __post_init__(self) -> None:
        if not self.inputs or len(self.inputs) != len(self.outputs):
            raise ValueError("unit_tests needs non-empty `inputs` and `outputs` lists of the same length")


class CodeMetadata(msgspec.Struct, kw_only=True):
    unit_tests: UnitTests


class CodeRow(Row):
    """A code_gen row: the tests under `verifier_metadata.unit_tests`; generated rows add their `problem`."""

    verifier_metadata: CodeMetadata
    problem: Optional[dict[str, Any]] = None


class CodeGen(Environment):
    name = "code_gen"
    verifier_version = "1"
    row_type = CodeRow

    def __init__(
        self,
        reward: Literal["fraction", "all"] = "all",
        start_sandbox_worker: bool = True,
        sandbox_workers: int = 2,
        redis_url: Optional[str] = None,
        queue: Optional[str] = None,
        wall_s: float = 10.0,
        cpu_s: int = 5,
        memory_mb: int = 512,
        allow_network: bool = False,
        sandbox_wait_s: float = WAIT_MARGIN_S,
        sandbox_redis_url: Optional[str] = None,
    ):
        if reward not in ("fraction", "all"):
            raise ValueError(f"reward must be 'fraction' or 'all', got {reward!r}")
        self.reward = reward
        self.limits = Limits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=memory_mb, allow_network=allow_network)
        self.workers = sandbox_workers if start_sandbox_worker else 0
        # redis_url is the older name of sandbox_redis_url; neither set: a private Redis for the queue.
        self.redis_url, self.queue, self.sandbox_wait_s = sandbox_redis_url or redis_url, queue, sandbox_wait_s
        self.agent = AgentSettings(
            loop="single_turn", max_steps=1, sampling={"max_tokens": 512}, verify_timeout_s=wall_s + sandbox_wait_s + 15
        )
        self._client: Optional[SandboxClient] = None

    @property
    def client(self) -> SandboxClient:
        if self._client is None:
            if self.redis_url is None:
                self._client = SandboxClient.private_queue(
                    start_workers=self.workers or 1, wait_margin_s=self.sandbox_wait_s
                )
            else:
                self._client = SandboxClient(
                    self.redis_url,
                    self.queue or "farm-sandbox",
                    start_workers=self.workers,
                    wait_margin_s=self.sandbox_wait_s,
                )
            atexit.register(self.close)  # a process that never calls aclose() still stops them
        return self._client

    async def aclose(self) -> None:
        """Stops the sandbox workers this environment started (and its private Redis)."""
        await asyncio.to_thread(self.close)

    async def verify(self, row: CodeRow, state: Any, transcript: Transcript) -> Verdict:
        tests = msgspec.structs.asdict(row.verifier_metadata.unit_tests)
        code = extract_code(transcript.final_text)
        if code is None:
            return Verdict(
                reward=0.0,
                components={"has_code": 0.0, "pass_fraction": 0.0, "all_passed": 0.0},
                metrics={"reason": "no_code", "passed": 0, "total": len(tests["inputs"])},
            )
        try:
            result = await self.client.run(code, tests, self.limits)
        except SandboxError as exc:
            raise RolloutFailure(ErrorKind.sandbox_error, f"code sandbox: {exc}") from None
        fraction = result.fraction if result.reason == "ok" else 0.0
        all_passed = float(result.reason == "ok" and result.passed == result.total)
        failure = {} if result.reason == "ok" else {"failure_kind": result.reason}
        return Verdict(
            reward=fraction if self.reward == "fraction" else all_passed,
            components={"has_code": 1.0, "pass_fraction": fraction, "all_passed": all_passed},
            metrics={
                "reason": result.reason,
                "passed": result.passed,
                "total": result.total,
                "sandbox_s": result.duration_s,
                **failure,
                **({"detail": result.detail} if result.detail else {}),
            },
        )

    def generate(self, size: int, seed: int = 0) -> list[dict]:
        return generate(size, seed)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
