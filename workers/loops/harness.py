"""Harness agents: a team's own agent code, run unchanged against the worker's model gateway.

A workers config names the harness and the environment that gives it tools and verifies it:

    agents:
      my_agent:
        harness: mypkg.agent:run     # async def run(client: openai.AsyncOpenAI, task) -> str | None
        env: single_tool_call
      my_cli_agent:
        command: ["python", "-m", "mypkg.cli"]   # a program per rollout (workers/loops/command.py)
        env: single_tool_call                    # (command_in_sandbox: workers/loops/sandbox_command.py)

In-process harnesses are trusted code: they run in the worker's event loop, with the worker's
rights. A plain (blocking) function is refused at start-up, since it would freeze the event loop
that every other rollout of the process runs on; blocking code runs through `command:`.

The harness gets an `openai.AsyncOpenAI` client for its rollout (its base URL carries the rollout's
secret; `max_retries=0`; its requests reach the gateway in process, through an httpx transport
that calls the gateway's handler: no socket, the same answers as over HTTP) and a
`HarnessTask` (its attribute names are the contract). What the harness returns is the final
answer the environment's verifier reads, with the tool calls it made through `task.call_tool` and
the environment state they changed; a harness that grades itself calls `task.report(reward,
components)`, which the `verifiers` environment takes as the reward (other environments record
it as the metric `reported_reward` and verify as usual).

Outcomes. A harness that raises is an `agent_error`, retried per `max_attempts`. One that returns
without calling the model fails at once (`agent_error`, not retried: it would do the same again).
Past `max_steps` calls, the rollout's token budget (`max_rollout_tokens`) or the model's context,
the gateway refuses the call and the rollout ends `truncated` with the gateway's reason, which
wins over whatever the harness raised then; the harness is stopped. A policy failure fails the
rollout (kind `policy`). A cancelled or timed-out task stops the harness (a command's whole
process group is killed) and cancels its open model calls.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shlex
import time
from typing import Any, Callable, Optional

from envs.sdk import AgentSettings, Environment, Tool, Transcript, Verdict, add_to_prompt
from farm.agent_config import AgentConfig
from farm.errors import ConfigError, RolloutFailure
from farm.lazy import import_object
from farm.schema import ErrorKind, Rollout, Task, Timings
from farm.settings import Settings
from workers.gateway.calls import Limits, RolloutCalls
from workers.gateway.local import local_http
from workers.gateway.server import Gateway
from workers.loops.command import STDERR_CHARS, run_command
from workers.loops.context import AgentContext
from workers.loops.env_calls import EnvironmentAgent, call_tool, read_row, sampling_for, scored
from workers.loops.sandbox_command import SandboxCommand
from workers.policy.chat import ChatTokenizer, chat_tools
from workers.policy.tokens import PolicyClient

__all__ = ["HarnessAgent", "HarnessTask", "load_harness"]

STOP_WAIT_S = 5.0  # a stopped harness has this long to unwind before the rollout ends without it


class HarnessTask:
    """What a harness gets besides its client. These names are the contract:

    messages   the row's input as chat messages (system first)
    tools      the environment's tools as OpenAI tool specs (chat form)
    model      the model name to send
    row        the dataset row
    sampling   the task's sampling (the gateway imposes it whatever the request says)
    limits     {"max_steps", "max_tokens" (per call), "max_rollout_tokens"}
    base_url, api_key   for a harness that builds its own client
    task_id    the farm's task id
    await call_tool(name, arguments) -> str   the environment's tool on this rollout's state
    report(reward, components=None)           the harness's own grade
    report_failure(error)                     its grader failed: a `verifier` failure, not retried
    """

    def __init__(self, task: Task, messages: list[dict], tools: list[dict], calls: RolloutCalls, gateway: Gateway):
        self.task_id = task.task_id
        self.messages = messages
        self.tools = tools
        self.model = calls.model
        self.row = task.row
        self.sampling = dict(calls.sampling)
        self.limits = calls.limits.as_dict()
        self.base_url = gateway.base_url(calls)
        self.api_key = calls.secret
        self._calls = calls

    async def call_tool(self, name: str, arguments: Any = None) -> str:
        """The environment's tool `name` with `arguments` (a dict, or its JSON text); its result as text
        (a tool's own error comes back as text the model can read, as in the farm's own loop)."""
        if arguments is None:
            arguments = {}
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except ValueError as exc:
                return f"Error: tool call arguments are not JSON: {exc}"
        return await self._calls.call_tool(name, arguments)

    def report(self, reward: float, components: Optional[dict[str, float]] = None) -> None:
        self._calls.report(reward, components)

    def report_failure(self, error: Any) -> None:
        self._calls.report_failure(error)

    def __repr__(self) -> str:  # never the secret
        return (
            f"HarnessTask({self.task_id}, model={self.model!r}, {len(self.messages)} messages, {len(self.tools)} tools)"
        )


def load_harness(spec: str) -> Callable[..., Any]:
    """The `module:function` a config names, checked to be an async function of (client, task)."""
    module, _, attr = spec.partition(":")
    try:
        fn = import_object(spec)
    except ImportError as exc:
        from envs.sdk.environment import missing_module_hint

        raise ConfigError(f"harness {spec}: cannot import {module}: {exc}{missing_module_hint(module, exc)}") from None
    except AttributeError:
        raise ConfigError(f"harness {spec}: {module} has no {attr}") from None
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))
    if not is_async:
        raise ConfigError(
            f"harness {spec} is not an async function: a blocking harness would freeze every rollout of the "
            "worker; write `async def run(client, task)` or run it as a program with `command:`"
        )
    return fn


def _load_sdk(http: Any) -> None:
    """Import the openai SDK and the lazily loaded parts a chat or responses call needs now, at
    start-up, so the first wave of rollouts does not wait on imports (about half a second)."""
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletion  # noqa: F401
    from openai.types.responses import Response  # noqa: F401

    client = AsyncOpenAI(base_url="http://127.0.0.1/v1", api_key="-", max_retries=0, http_client=http)
    client.chat.completions, client.responses  # noqa: B018


class HarnessAgent(EnvironmentAgent):
    """Runs a harness (in process) or a command (a program) per task, through the process's gateway."""

    files_per_loop = 3  # the gateway's connection to the model; a harness's own client's socket, both ends

    def __init__(
        self,
        name: str,
        env: Environment,
        client: PolicyClient,
        tok: ChatTokenizer,
        loop_settings: AgentSettings,
        cfg: AgentConfig,
        settings: Settings,
    ):
        self.name, self.env, self.client, self.tok = name, env, client, tok
        self.settings, self.cfg, self.farm = loop_settings, cfg, settings
        self.tools: dict[str, Tool] = {t.name: t for t in env.tools()}
        self.schemas = chat_tools([t.schema() for t in self.tools.values()])
        self.harness = load_harness(cfg.harness) if cfg.harness else None
        self.argv: list[str] = shlex.split(cfg.command) if isinstance(cfg.command, str) else list(cfg.command or [])
        self.in_sandbox = SandboxCommand.of(name, cfg, env, self.argv)
        self.gateway: Optional[Gateway] = None
        self.http: Any = None

    async def setup(self) -> None:
        await super().setup()
        self.gateway = await Gateway(self.client, self.tok, self.farm.gateway_host, self.farm.gateway_port).start()
        if self.in_sandbox is not None:
            self.sandboxes = await self.in_sandbox.mount(self.sandboxes, self.gateway)
        if self.harness is not None:
            self.http = local_http(self.gateway)
            _load_sdk(self.http)

    def ready(self) -> bool:
        return self.client.ready()

    async def wait_ready(self) -> None:
        await self.client.wait_ready()

    async def close_policy(self) -> None:
        if self.gateway is not None:
            await self.gateway.aclose()
        await self.client.aclose()

    # -- one rollout ----------------------------------------------------------------------------
    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        if self.gateway is None:
            await self.setup()
        assert self.gateway is not None
        row, params, messages, _ = read_row(self.env, task.row)
        tools = chat_tools(params["tools"]) if params.get("tools") else self.schemas
        state = await self.open_state(row, task, ctx)
        try:
            messages = add_to_prompt(messages, self.env.prompt_addition(row, state))  # a reset's observation
            return await self._rollout(task, ctx, row, messages, tools, state)
        finally:
            await self.close_state(state)

    async def _rollout(
        self, task: Task, ctx: AgentContext, row: Any, messages: list[dict], tools: list[dict], state: Any
    ) -> Rollout:
        assert self.gateway is not None
        sampling = sampling_for(task, self.settings.sampling)
        metrics: dict[str, Any] = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "bad_tool_calls": 0}
        # What the gateway samples with, whatever the harness asks (the trainer checks it: trainer/batch.py).
        metrics["sampling"] = {k: sampling.get(k) for k in ("temperature", "top_p")}
        calls_made: list[dict] = []
        limits = Limits(self.settings.max_steps, sampling.get("max_tokens"), self.cfg.max_rollout_tokens)
        calls = self.gateway.open_rollout(
            task,
            self.farm.policy_model,
            messages,
            tools,
            sampling,
            limits,
            lambda name, args: self._tool(name, args, state, metrics, calls_made),
        )
        htask = HarnessTask(task, messages, tools, calls, self.gateway)
        mark = ctx.versions.mark() if ctx.versions is not None else None
        started = time.perf_counter()
        try:
            answer = await self._drive(calls, htask, (row, state, metrics))
        finally:
            self.gateway.close(calls)
            calls.session.end()
        versions = ctx.versions.span(mark) if mark is not None and ctx.versions is not None else (None, None)
        elapsed = time.perf_counter() - started
        return await self._finish(task, row, state, calls, answer, metrics, calls_made, elapsed, versions)

    async def _tool(self, name: str, arguments: Any, state: Any, metrics: dict, made: list) -> str:
        """The environment's tool for the harness (the gateway records its output: RolloutCalls.call_tool)."""
        if isinstance(arguments, dict):
            metrics["tool_calls"] += 1
            made.append({"name": name, "arguments": arguments})
        start = time.perf_counter()
        result = await call_tool(self.tools, name, arguments, state, self.settings.tool_timeout_s, metrics)
        metrics["tools_s"] = metrics.get("tools_s", 0.0) + time.perf_counter() - start
        return result

    async def _drive(self, calls: RolloutCalls, htask: HarnessTask, where: tuple) -> Any:
        """Run the harness until it returns or the gateway stops the rollout; the harness's answer."""
        run = asyncio.ensure_future(self._invoke(calls, htask, where))
        stop = asyncio.ensure_future(calls.stopped.wait())
        try:
            await asyncio.wait({run, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not run.done():
                run.cancel()
                await asyncio.wait({run}, timeout=STOP_WAIT_S)
        if not run.done():
            raise RolloutFailure(
                ErrorKind.agent_error, f"the harness did not stop within {STOP_WAIT_S:g}s of being cancelled"
            )
        exc = None if run.cancelled() else run.exception()
        if calls.failure is not None:
            raise calls.failure
        if calls.stop_reason:
            return None  # the gateway's reason wins over whatever the harness raised
        if run.cancelled():
            raise RolloutFailure(ErrorKind.agent_error, "the harness cancelled itself", retryable=True)
        if isinstance(exc, RolloutFailure):
            raise exc
        if exc is not None and calls.refused is not None:  # it would ask the same again: not retried
            what = f" over its parameter `{calls.refused.param}`" if calls.refused.param else ""
            message = f"the gateway refused the harness's request{what}: {calls.refused.message}"
            raise RolloutFailure(ErrorKind.policy, message[:STDERR_CHARS], retryable=False)
        if exc is not None:
            raise RolloutFailure(
                ErrorKind.agent_error, f"the harness raised {type(exc).__name__}: {exc}"[:STDERR_CHARS], retryable=True
            )
        return run.result()

    async def _invoke(self, calls: RolloutCalls, htask: HarnessTask, where: tuple) -> Any:
        if self.in_sandbox is not None:  # where: the row, the state, the metrics
            return await self.in_sandbox.run(calls, *where)
        if self.harness is not None:
            from openai import AsyncOpenAI

            client = AsyncOpenAI(base_url=htask.base_url, api_key=htask.api_key, max_retries=0, http_client=self.http)
            return await self.harness(client, htask)
        assert self.gateway is not None
        return await run_command(self.argv, calls, self.gateway)

    async def _finish(
        self,
        task: Task,
        row: Any,
        state: Any,
        calls: RolloutCalls,
        answer: Any,
        metrics: dict,
        calls_made: list,
        elapsed: float,
        versions: tuple[Optional[int], Optional[int]],
    ) -> Rollout:
        if calls.calls == 0:
            raise RolloutFailure(
                ErrorKind.agent_error,
                "the harness returned without calling the model (it must use the client it is given, "
                "or task.base_url and task.api_key)",
                retryable=False,
            )
        segments = calls.bridge.segments
        try:
            traces = [s.trace() for s in segments]
        except ValueError as exc:
            raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
        metrics.update(calls.bridge.metrics(), turns=calls.calls, replica_moves=calls.session.moves)
        metrics["bad_tool_calls"] += calls.bad_tool_calls
        if calls.stop_reason:
            metrics["stop_reason"] = calls.stop_reason
        if calls.session.replica is not None:
            metrics["replica"] = calls.session.replica.url
        reported = None
        if calls.reported is not None:
            reported = Verdict(calls.reported[0], dict(calls.reported[1]))
            metrics["reported_reward"] = calls.reported[0]
        final = answer if isinstance(answer, str) else (calls.last_text if answer is None else json.dumps(answer))
        transcript = Transcript(
            final_text=final,
            output=calls.output,
            tool_calls=calls_made,
            truncated=bool(calls.stop_reason) or calls.truncated,
            reported=reported,
            trace=traces[0] if len(traces) == 1 else None,  # one segment: the rollout's ids from its first prompt
        )
        timings = Timings(model_s=calls.model_s, tools_s=metrics.pop("tools_s", 0.0))
        metrics["harness_s"] = round(elapsed, 4)
        limit = self.settings.verify_timeout_s
        rollout = await scored(
            self.env, task, row, state, transcript, limit, metrics, timings, trace=traces[0], segments=traces[1:]
        )
        start, end = versions
        if start is not None:
            rollout.policy_version = start
        rollout.policy_version_end = end
        return rollout
