"""The agent loop: policy turns, tools, follow-up user turns, then the verifier; one driver for
every policy backend (workers/policy/protocol.py: token ids in and out, or the openai client).

Loop kinds (AgentSettings.loop):
  single_turn   one policy call, then verify;
  tool_use      call tools while the model asks for them, until it answers without a
                tool call or max_steps policy calls were made;
  multi_turn    like tool_use, and when the model answers, the next follow-up user message
                from the row (`follow_up_messages`) is appended, until none are left.

A turn cut at max_tokens, a turn that did not end (no EOS), or a conversation past the
model's context ends the rollout `truncated` (the last two: the first one's flag); its metrics'
`stop_reason` says which (`length`, `context_length`). Tools and
the verifier run through workers/loops/env_calls.py with the same limits for every backend.
What a backend keeps of the conversation (the token trace and its invariants, or the chat
messages / Responses items) is its `Conversation`; the loop only adds to it and reads the
rollout's token fields from it at the end.

The first prompt is the row's, made once the environment's state is open, with the text the
environment adds to its last message then (Environment.prompt_addition: an `environment_factory`
class's `reset` observation, as TRL appends it); a continuation goes on from its recorded prompt,
which has it already.

The model is called in one place, `AgentLoop._model_turn`: the place to cancel an open model
request. Replicas are chosen by the rotation from the rollout's `Session`, made in `_start`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from envs.sdk import AgentSettings, Environment, Tool, Transcript, add_to_prompt
from farm.schema import Rollout, Task, Timings
from workers.loops.context import AgentContext
from workers.loops.env_calls import EnvironmentAgent, max_tokens_capped_by, read_row, run_call, sampling_for, scored
from workers.loops.partial import interrupted_rollout, resume_episode
from workers.policy.chat import ChatTokenizer, chat_tools
from workers.policy.protocol import Call, ContextOverflow, Conversation, Policy, Session, Turn
from workers.policy.token_policy import CompletionClient, TokenPolicy


@dataclass
class Episode:
    """One rollout in progress: its conversation, what the environment saw, and what it cost."""

    followups: list[str]
    row: Any  # the environment's typed Row
    state: Any
    sampling: dict
    session: Session
    output: list[dict] = field(default_factory=list)
    calls_made: list[dict] = field(default_factory=list)
    metrics: dict = field(default_factory=lambda: {"turns": 0, "tool_calls": 0, "tool_errors": 0, "bad_tool_calls": 0})
    timings: Timings = field(default_factory=Timings)
    truncated: bool = False
    final_text: str = ""
    agent_deadline: Optional[float] = None  # monotonic; past it no new turn starts (Environment.agent_time_limit)
    # Made once the state is open (`run`): the environment's prompt addition goes into the first prompt.
    convo: Conversation = field(init=False)


class AgentLoop(EnvironmentAgent):
    def __init__(self, env: Environment, policy: Policy[Any], settings: Optional[AgentSettings] = None):
        self.env = env
        self.policy = policy
        self.settings = settings or env.agent
        self.tools: dict[str, Tool] = {t.name: t for t in env.tools()}
        self.schemas = chat_tools([t.schema() for t in self.tools.values()])

    @classmethod
    def over_tokens(
        cls,
        env: Environment,
        client: CompletionClient,
        tokenizer: ChatTokenizer,
        settings: Optional[AgentSettings] = None,
    ) -> "AgentLoop":
        """The loop over the tokens backend, from a completion client (workers/policy/tokens.py's
        PolicyClient, or a stand-in with its `complete` and `max_model_len`) and the tokenizer."""
        return cls(env, TokenPolicy(client, tokenizer), settings)

    async def close_policy(self) -> None:
        await self.policy.aclose()

    def ready(self) -> bool:
        """Whether some policy replica can take a request now (the worker fetches only then)."""
        return self.policy.ready()

    async def wait_ready(self) -> None:
        await self.policy.wait_ready()

    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        """One rollout: sample a turn, answer its tool calls (or the row's next user turn), until done.
        A continuation (`task.resume`) goes on from where its interrupted rollout stopped; a run
        cancelled by an interrupt (`ctx.interrupts`) returns what it generated so far."""
        ep, messages, tools = self._start(task)
        ep.state = await self.open_state(ep.row, task, ctx)
        try:
            if task.resume is None:  # a continuation's recorded prompt has the addition already
                messages = add_to_prompt(messages, self.env.prompt_addition(ep.row, ep.state))
            ep.convo = self.policy.conversation(messages, tools)
            return await self._episode(task, ctx, ep)
        finally:
            await self.close_state(ep.state)

    async def _episode(self, task: Task, ctx: AgentContext, ep: Episode) -> Rollout:
        mark = ctx.versions.mark() if ctx.versions is not None else None
        if hasattr(ep.convo, "version_of"):
            ep.convo.version_of = lambda: _live_version(ctx, task)
        limit = self.env.agent_time_limit(ep.row)
        ep.agent_deadline = None if limit is None else time.monotonic() + limit
        try:
            if task.resume is not None:
                await resume_episode(self, ep, task.resume, _model(ctx))
            for step in range(ep.metrics["turns"], self.settings.max_steps):
                if ep.agent_deadline is not None and time.monotonic() >= ep.agent_deadline:
                    ep.metrics["agent_timeout"] = True  # the agent's time is up: the verifier grades what it did
                    break
                turn = await self._model_turn(ep, step)
                if turn is None:
                    break
                new = await self._respond(ep, turn)
                if not new or step == self.settings.max_steps - 1:
                    ep.metrics["hit_max_steps"] = bool(new)
                    break
                ep.convo.extend(new)
        except asyncio.CancelledError:
            if task.task_id not in ctx.interrupts:
                raise
            ctx.interrupts.discard(task.task_id)
            _swallow_cancel()
            return interrupted_rollout(ep, task, _model(ctx))
        finally:
            ep.session.end()  # the replica stops counting this rollout (group placement's load)
        versions = ctx.versions.span(mark) if mark is not None and ctx.versions is not None else (None, None)
        return await self._finish(task, ep, versions)

    def _start(self, task: Task) -> tuple[Episode, list[dict], list[dict]]:
        """The episode, the row's first prompt (its chat messages) and the tools it offers."""
        row, params, messages, followups = read_row(self.env, task.row)
        tools = chat_tools(params["tools"]) if params.get("tools") else self.schemas
        ep = Episode(
            followups=followups,
            row=row,
            state=None,  # opened by run (Environment.open_state), closed when the rollout ends
            sampling=sampling_for(task, self.settings.sampling),
            session=Session(group=task.group_id, key=task.task_id),
        )
        # What it really samples with (an agent's `sampling` override may differ from the task's):
        # the trainer refuses a rollout sampled at another temperature or top_p (trainer/batch.py).
        ep.metrics["sampling"] = {k: ep.sampling.get(k) for k in ("temperature", "top_p")}
        capped = max_tokens_capped_by(task, ep.sampling)
        if capped:  # the environment's max_tokens under the task's: said, not silent
            ep.metrics.update(max_tokens=ep.sampling["max_tokens"], max_tokens_capped_by=capped)
        return ep, messages, tools

    async def _model_turn(self, ep: Episode, step: int) -> Optional[Turn]:
        """One model turn, added to the conversation and the output; None when the rollout ends here."""
        t0 = time.perf_counter()
        try:
            turn = await self.policy.turn(ep.convo, ep.sampling, ep.session, step)
        except ContextOverflow:
            ep.truncated = True
            ep.metrics["stop_reason"] = "context_length"
            return None
        finally:
            ep.timings.model_s += time.perf_counter() - t0
        ep.convo.add_reply(turn)
        ep.metrics["turns"] += 1
        if step == 0 and ep.session.replica is not None:
            ep.metrics["replica"] = ep.session.replica.url  # where the rollout started (its prefix cache)
        ep.final_text = turn.text
        if turn.text or not turn.calls or self.settings.loop == "single_turn":
            ep.output.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": turn.text}]}
            )
        if turn.truncated or not turn.ended:
            ep.truncated = turn.truncated
            if turn.truncated:
                ep.metrics["stop_reason"] = "length"  # the turn reached max_tokens (see max_tokens_capped_by)
            return None
        return turn

    async def _respond(self, ep: Episode, turn: Turn) -> list[dict]:
        """The environment's answer to a turn: its tool results, else the row's next user turn (multi_turn)."""
        new: list[dict] = []
        if self.settings.loop != "single_turn" and turn.calls:
            t1 = time.perf_counter()
            new = await self._run_tools(turn.calls, ep)
            ep.timings.tools_s += time.perf_counter() - t1
        if not new and self.settings.loop == "multi_turn" and ep.followups:
            new = [{"role": "user", "content": ep.followups.pop(0)}]
            ep.output.append(
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": new[0]["content"]}]}
            )
        return new

    async def _run_tools(self, calls: list[Call], ep: Episode) -> list[dict]:
        """Run each call; every result (or error) becomes a tool message, and goes into the output items.
        A call never runs past the agent's time (Environment.agent_time_limit)."""
        results = []
        for call in calls:
            limit = self.settings.tool_timeout_s
            if ep.agent_deadline is not None:
                limit = max(0.001, min(limit, ep.agent_deadline - time.monotonic()))
            result = await run_call(call, self.tools, ep.state, limit, ep.output, ep.calls_made, ep.metrics)
            results.append({"role": "tool", "tool_call_id": call.call_id, "content": result})
        return results

    async def _finish(self, task: Task, ep: Episode, versions: tuple[Optional[int], Optional[int]]) -> Rollout:
        fields = ep.convo.rollout_fields()
        ep.metrics.update(ep.convo.token_metrics(), replica_moves=ep.session.moves)
        transcript = Transcript(
            final_text=ep.final_text,
            output=ep.output,
            tool_calls=ep.calls_made,
            truncated=ep.truncated,
            trace=fields.get("trace"),
        )
        limit = self.settings.verify_timeout_s
        rollout = await scored(self.env, task, ep.row, ep.state, transcript, limit, ep.metrics, ep.timings, **fields)
        start, end = versions
        if start is not None:
            rollout.policy_version = start
        rollout.policy_version_end = end
        return rollout


def _live_version(ctx: AgentContext, task: Task) -> int:
    """The policy version served now (the task's when no trainer announces versions)."""
    live = ctx.versions.live if ctx.versions is not None else None
    return task.policy_version if live is None else live


def _swallow_cancel() -> None:
    """An interrupt is answered, not propagated: the run's task returns its rollout."""
    me = asyncio.current_task()
    if me is not None:
        me.uncancel()


def _model(ctx: AgentContext) -> str:
    """The served model's name, which a partial rollout records and a resume checks."""
    return getattr(ctx.settings, "policy_model", "") or ""
