"""The policy agent loop: token-in, token-out turns against the policy, tools, then the verifier.

Loop kinds (AgentSettings.loop):
  single_turn   one policy call, then verify;
  tool_use      call tools while the model asks for them, until it answers without a
                tool call or max_steps policy calls were made;
  multi_turn    like tool_use, and when the model answers, the next follow-up user message
                from the row (`follow_up_messages`) is appended, until none are left.

The trace keeps the first prompt's ids, then every sampled id (env_mask 1, with its logprob)
and every id the environment inserted (env_mask 0, logprob 0.0). Before each call the new
prompt is checked to extend the previous prompt + completion exactly; a broken invariant
fails the rollout (kind `invariant`) rather than feeding the trainer wrong tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Optional

from envs.sdk import AgentSettings, Environment, Tool, Transcript
from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Rollout, Task, Timings, TokenTrace
from workers.loops.context import AgentContext
from workers.loops.env_calls import EnvironmentAgent, read_row, run_call, sampling_for, scored
from workers.policy.chat import ChatTokenizer, chat_tools, parse_tool_calls
from workers.policy.tokens import ContextOverflow, PolicyClient, Session


@dataclass
class Episode:
    """One rollout in progress: the conversation, the token trace so far, and what it cost."""

    history: list[dict]
    template_tools: Any
    followups: list[str]
    row: Any  # the environment's typed Row
    state: Any
    sampling: dict
    prompt: list[int]
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)
    output: list[dict] = field(default_factory=list)
    calls_made: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=lambda: {"turns": 0, "tool_calls": 0, "tool_errors": 0, "bad_tool_calls": 0})
    timings: Timings = field(default_factory=Timings)
    session: Session = field(default_factory=Session)
    truncated: bool = False
    final_text: str = ""
    sent: Optional[list[int]] = None
    versions: tuple[Optional[int], Optional[int]] = (None, None)  # policy version at start, and at end if changed


class PolicyAgent(EnvironmentAgent):
    def __init__(
        self, env: Environment, policy: PolicyClient, tokenizer: ChatTokenizer, settings: Optional[AgentSettings] = None
    ):
        self.env = env
        self.policy = policy
        self.tok = tokenizer
        self.settings = settings or env.agent
        self.tools: dict[str, Tool] = {t.name: t for t in env.tools()}
        self.schemas = chat_tools([t.schema() for t in self.tools.values()])

    async def close_policy(self) -> None:
        await self.policy.aclose()

    def ready(self) -> bool:
        """Whether some policy replica can take a request now (the worker fetches only then).

        A stand-in policy without replicas (tests' scripted policies) is always ready."""
        ready = getattr(self.policy, "ready", None)
        return ready is None or ready()

    async def wait_ready(self) -> None:
        await self.policy.wait_ready()

    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        """One rollout: sample a turn, answer its tool calls (or the row's next user turn), until done."""
        ep = self._start(task)
        mark = ctx.versions.mark() if ctx.versions is not None else None
        for step in range(self.settings.max_steps):
            text = await self._sample(ep, step)
            if text is None:
                break
            new = await self._respond(ep, text, step)
            if not new or step == self.settings.max_steps - 1:
                ep.metrics["hit_max_steps"] = bool(new)
                break
            self._append_env(ep, new)
        if mark is not None and ctx.versions is not None:
            ep.versions = ctx.versions.span(mark)
        return await self._finish(task, ep)

    def _start(self, task: Task) -> "Episode":
        row, params, messages, followups = read_row(self.env, task.row)
        schemas = chat_tools(params["tools"]) if params.get("tools") else self.schemas
        history, template_tools = self.tok.with_tools(messages, schemas)
        return Episode(
            history=history,
            template_tools=template_tools,
            followups=followups,
            row=row,
            state=self.env.new_state(row),
            sampling=sampling_for(task, self.settings.sampling),
            prompt=self.tok.prompt_ids(history, template_tools),
        )

    async def _sample(self, ep: "Episode", step: int) -> Optional[str]:
        """One model turn appended to the trace; its text, or None when the rollout ends here."""
        request = ep.prompt + ep.ids
        if ep.sent is not None and request[: len(ep.sent)] != ep.sent:
            raise RolloutFailure(ErrorKind.invariant, f"turn {step}: prompt does not extend the previous one")
        budget = await self.policy.max_model_len(ep.session)
        max_tokens = ep.sampling.get("max_tokens")
        if budget is not None:
            room = budget - len(request)
            if room <= 0:
                ep.truncated = True
                return None
            max_tokens = min(max_tokens or room, room)
        t0 = time.perf_counter()
        try:
            c = await self.policy.complete(request, {**ep.sampling, "max_tokens": max_tokens}, ep.session)
        except ContextOverflow:
            ep.truncated = True
            return None
        finally:
            ep.timings.model_s += time.perf_counter() - t0
        if len(c.ids) != len(c.logprobs):
            raise RolloutFailure(ErrorKind.invariant, f"{len(c.ids)} ids but {len(c.logprobs)} logprobs")
        ep.sent = request + c.ids
        ep.turns.append((len(ep.ids), len(ep.ids) + len(c.ids)))
        ep.ids += c.ids
        ep.logprobs += c.logprobs
        ep.mask += [1] * len(c.ids)
        ep.metrics["turns"] += 1
        ended = bool(c.ids) and c.ids[-1] == self.tok.eos_id
        text = self.tok.decode(c.ids[:-1] if ended else c.ids)
        ep.final_text = text
        ep.output.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
        if c.finish_reason == "length" or not ended:
            ep.truncated = c.finish_reason == "length"
            return None
        ep.history.append({"role": "assistant", "content": text})
        return text

    async def _respond(self, ep: "Episode", text: str, step: int) -> list[dict]:
        """The environment's answer to a turn: its tool results, else the row's next user turn (multi_turn)."""
        new: list[dict] = []
        if self.settings.loop != "single_turn":
            t1 = time.perf_counter()
            new = await self._run_tools(text, step, ep.state, ep.output, ep.calls_made, ep.metrics)
            ep.timings.tools_s += time.perf_counter() - t1
        if not new and self.settings.loop == "multi_turn" and ep.followups:
            new = [{"role": "user", "content": ep.followups.pop(0)}]
            ep.output.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": new[0]["content"]}]}
            )
        return new

    def _append_env(self, ep: "Episode", new: list[dict]) -> None:
        """The environment's messages as tokens in the trace (env_mask 0), without re-tokenizing sampled ids."""
        try:
            env_ids = self.tok.append_ids(ep.history, ep.template_tools, new)
        except ValueError as exc:
            raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
        ep.history += new
        ep.ids += env_ids
        ep.logprobs += [0.0] * len(env_ids)
        ep.mask += [0] * len(env_ids)

    async def _finish(self, task: Task, ep: "Episode") -> Rollout:
        try:
            trace = TokenTrace.build(ep.prompt, ep.ids, ep.logprobs, ep.mask, ep.turns)
        except ValueError as exc:
            raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
        ep.metrics.update(
            prompt_tokens=len(ep.prompt),
            completion_tokens=sum(ep.mask),
            env_tokens=len(ep.mask) - sum(ep.mask),
            replica_moves=ep.session.moves,
        )
        transcript = Transcript(
            final_text=ep.final_text, output=ep.output, tool_calls=ep.calls_made, truncated=ep.truncated
        )
        rollout = await scored(
            self.env,
            task,
            ep.row,
            ep.state,
            transcript,
            self.settings.verify_timeout_s,
            ep.metrics,
            ep.timings,
            trace=trace,
        )
        start, end = ep.versions
        if start is not None:
            rollout.policy_version = start
        rollout.policy_version_end = end
        return rollout

    async def _run_tools(
        self, text: str, step: int, state: Any, output: list, calls_made: list, metrics: dict
    ) -> list[dict]:
        """Run the tool calls in `text`; every result (or error) becomes a tool message."""
        results = []
        for call in parse_tool_calls(text, step):
            result = await run_call(call, self.tools, state, self.settings.tool_timeout_s, output, calls_made, metrics)
            results.append({"role": "tool", "content": result})
        return results
