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
from typing import Any, Optional

from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Rollout, Task, Timings, TokenTrace
from envs.base import AgentSettings, Environment, Tool, Transcript
from workers.agent import AgentContext
from workers.env_calls import read_row, run_call, sampling_for, scored
from workers.chat import ChatTokenizer, chat_tools, parse_tool_calls
from workers.policy import ContextOverflow, PolicyClient, Session


class PolicyAgent:
    def __init__(self, env: Environment, policy: PolicyClient, tokenizer: ChatTokenizer,
                 settings: Optional[AgentSettings] = None):
        self.env = env
        self.policy = policy
        self.tok = tokenizer
        self.settings = settings or env.agent
        self.tools: dict[str, Tool] = {t.name: t for t in env.tools()}
        self.schemas = chat_tools([t.schema() for t in self.tools.values()])

    async def aclose(self) -> None:
        await self.policy.aclose()

    def ready(self) -> bool:
        """Whether some policy replica can take a request now (the worker fetches only then).

        A stand-in policy without replicas (tests' scripted policies) is always ready."""
        ready = getattr(self.policy, "ready", None)
        return ready is None or ready()

    async def wait_ready(self) -> None:
        await self.policy.wait_ready()

    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        row = task.row
        params, messages, followups = read_row(row)
        schemas = chat_tools(params["tools"]) if params.get("tools") else self.schemas
        history, template_tools = self.tok.with_tools(messages, schemas)
        state = self.env.new_state(row)
        sampling = sampling_for(task, self.settings.sampling)
        loop = self.settings.loop

        prompt = self.tok.prompt_ids(history, template_tools)
        ids: list[int] = []
        logprobs: list[float] = []
        mask: list[int] = []
        turns: list[tuple[int, int]] = []
        output: list[dict] = []
        calls_made: list[dict] = []
        metrics = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "bad_tool_calls": 0}
        timings = Timings()
        session = Session()
        truncated = False
        final_text = ""
        sent: Optional[list[int]] = None

        for step in range(self.settings.max_steps):
            request = prompt + ids
            if sent is not None and request[:len(sent)] != sent:
                raise RolloutFailure(ErrorKind.invariant, f"turn {step}: prompt does not extend the previous one")
            budget = await self.policy.max_model_len(session)
            max_tokens = sampling.get("max_tokens")
            if budget is not None:
                room = budget - len(request)
                if room <= 0:
                    truncated = True
                    break
                max_tokens = min(max_tokens or room, room)
            t0 = time.perf_counter()
            try:
                c = await self.policy.complete(request, {**sampling, "max_tokens": max_tokens}, session)
            except ContextOverflow:
                truncated = True
                break
            finally:
                timings.model_s += time.perf_counter() - t0
            if len(c.ids) != len(c.logprobs):
                raise RolloutFailure(ErrorKind.invariant, f"{len(c.ids)} ids but {len(c.logprobs)} logprobs")
            sent = request + c.ids
            turns.append((len(ids), len(ids) + len(c.ids)))
            ids += c.ids
            logprobs += c.logprobs
            mask += [1] * len(c.ids)
            metrics["turns"] += 1
            ended = bool(c.ids) and c.ids[-1] == self.tok.eos_id
            text = self.tok.decode(c.ids[:-1] if ended else c.ids)
            final_text = text
            output.append({"type": "message", "role": "assistant",
                           "content": [{"type": "output_text", "text": text}]})
            if c.finish_reason == "length" or not ended:
                truncated = c.finish_reason == "length"
                break
            history.append({"role": "assistant", "content": text})

            new: list[dict] = []
            if loop != "single_turn":
                t1 = time.perf_counter()
                new = await self._run_tools(text, step, state, output, calls_made, metrics)
                timings.tools_s += time.perf_counter() - t1
            if not new and loop == "multi_turn" and followups:
                new = [{"role": "user", "content": followups.pop(0)}]
                output.append({"type": "message", "role": "user",
                               "content": [{"type": "input_text", "text": new[0]["content"]}]})
            if not new or step == self.settings.max_steps - 1:
                metrics["hit_max_steps"] = bool(new)
                break
            try:
                env_ids = self.tok.append_ids(history, template_tools, new)
            except ValueError as exc:
                raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
            history += new
            ids += env_ids
            logprobs += [0.0] * len(env_ids)
            mask += [0] * len(env_ids)

        try:
            trace = TokenTrace.build(prompt, ids, logprobs, mask, turns)
        except ValueError as exc:
            raise RolloutFailure(ErrorKind.invariant, str(exc)) from None
        metrics.update(prompt_tokens=len(prompt), completion_tokens=sum(mask), env_tokens=len(mask) - sum(mask),
                       replica_moves=session.moves)
        transcript = Transcript(final_text=final_text, output=output, tool_calls=calls_made, truncated=truncated)
        return await scored(self.env, task, state, transcript, self.settings.verify_timeout_s, metrics, timings,
                             trace=trace)

    async def _run_tools(self, text: str, step: int, state: Any, output: list, calls_made: list,
                         metrics: dict) -> list[dict]:
        """Run the tool calls in `text`; every result (or error) becomes a tool message."""
        results = []
        for call in parse_tool_calls(text, step):
            result = await run_call(call, self.tools, state, self.settings.tool_timeout_s, output, calls_made, metrics)
            results.append({"role": "tool", "content": result})
        return results
