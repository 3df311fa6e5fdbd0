"""Hosted and OpenAI-compatible policies through the `openai` client (policy_kind chat / responses).

The tokens path (workers/loops/loop.py) needs vLLM's /v1/completions and the model's tokenizer, so
that the trainer gets the exact ids the policy sampled. Evaluation and offline collection
against hosted APIs, or against vLLM's chat endpoint, need neither: they speak chat
completions or the Responses API and return text. Rollouts made here carry the conversation,
the reward and the metrics, but no token ids (trace None, trainable False): the trainer
refuses them rather than train on re-tokenized text.

The loop (single_turn / tool_use / multi_turn, max_steps, follow-up messages) mirrors
workers/loops/loop.py; tools and the verifier run through workers/loops/env_calls.py with the same limits;
the clients, replica choice and error mapping live in workers/policy/openai_pool.py.

  chat       client.chat.completions.create; tool calls from the message's `tool_calls`, or,
             when it has none, Hermes `<tool_call>` tags in the text (what small models write
             when the server has no tool parser); results go back as `role: tool` messages.
  responses  client.responses.create; `function_call` items -> tools -> `function_call_output`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Union

from envs.sdk import AgentSettings, Environment, Tool, Transcript
from farm.errors import RolloutFailure
from farm.schema import ErrorKind, Rollout, Task, Timings
from farm.settings import Settings
from workers.loops.context import AgentContext
from workers.loops.env_calls import EnvironmentAgent, read_row, run_call, sampling_for, scored
from workers.policy.chat import TOOL_SYSTEM, BadToolCall, ToolCall, chat_tools, parse_tool_calls
from workers.policy.openai_pool import ContextOverflow, Replicas

if TYPE_CHECKING:
    import openai

Call = Union[ToolCall, BadToolCall]
_CHAT_ARGS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_tokens",
    "seed": "seed",
    "stop": "stop",
}
# The Responses API has no seed or stop; the rest of an environment's extras go in extra_body.
_RESPONSES_ARGS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "max_tokens": "max_output_tokens",
    "seed": None,
    "stop": None,
}


@dataclass
class Turn:
    text: str
    calls: list[Call]
    truncated: bool
    usage: Optional[tuple[int, int]]  # prompt and completion tokens, when the server reports them


def native_call(call_id: str, name: str, arguments: Optional[str]) -> Call:
    """A server-parsed tool call (JSON arguments as text) as a ToolCall, or a BadToolCall."""
    try:
        args = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        error = f"invalid JSON in tool call arguments: {exc.msg} at char {exc.pos}"
        return BadToolCall(arguments or "", error, call_id)
    if not isinstance(args, dict):
        return BadToolCall(arguments or "", "tool call arguments must be a JSON object", call_id)
    return ToolCall(name, args, call_id)


def tools_in_system(messages: list[dict], tools: list[dict]) -> list[dict]:
    """Chat-style tools described in the system prompt, for servers that take no `tools`."""
    text = TOOL_SYSTEM.format(schemas="\n".join(json.dumps(t["function"]) for t in tools))
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def request_args(sampling: dict[str, Any], names: dict[str, Optional[str]]) -> dict[str, Any]:
    """Sampling as the API's keyword arguments; settings the API does not name go in extra_body."""
    kw: dict[str, Any] = {}
    extra = {}
    for key, value in sampling.items():
        if value is None:
            continue
        if key not in names:
            extra[key] = value
        elif names[key] is not None:
            kw[names[key]] = value
    if extra:
        kw["extra_body"] = extra
    return kw


class ChatConversation:
    def __init__(self, messages: list[dict], tools: list[dict]):
        self.messages, self.tools = list(messages), chat_tools(tools)
        self._reply: dict = {}

    def prompt_tools(self) -> None:
        if self.tools:
            self.messages, self.tools = tools_in_system(self.messages, self.tools), []

    async def turn(self, client: openai.AsyncOpenAI, model: str, sampling: dict, step: int) -> Turn:
        kw = request_args(sampling, _CHAT_ARGS)
        if self.tools:
            kw["tools"] = self.tools
        resp = await client.chat.completions.create(model=model, messages=self.messages, **kw)
        if not resp.choices:
            raise RolloutFailure(ErrorKind.policy, "the policy answered without choices", retryable=True)
        choice = resp.choices[0]
        text = choice.message.content or ""
        native = [tc for tc in choice.message.tool_calls or [] if getattr(tc, "function", None) is not None]
        calls = [native_call(tc.id, tc.function.name, tc.function.arguments) for tc in native]
        self._reply = {"role": "assistant", "content": text}
        if native:
            self._reply = {
                "role": "assistant",
                "content": choice.message.content,
                "tool_calls": [tc.model_dump(exclude_none=True) for tc in native],
            }
        usage = (resp.usage.prompt_tokens, resp.usage.completion_tokens) if resp.usage else None
        return Turn(text, calls or parse_tool_calls(text, step), choice.finish_reason == "length", usage)

    def add_reply(self) -> None:
        self.messages.append(self._reply)

    def add_result(self, call_id: str, result: str) -> None:
        self.messages.append({"role": "tool", "tool_call_id": call_id, "content": result})

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})


class ResponsesConversation:
    def __init__(self, messages: list[dict], tools: list[dict]):
        self.items = [{"role": m["role"], "content": m["content"]} for m in messages]
        self.tools = chat_tools(tools)
        self._reply: list[dict] = []

    def prompt_tools(self) -> None:
        if self.tools:
            self.items, self.tools = tools_in_system(self.items, self.tools), []

    async def turn(self, client: openai.AsyncOpenAI, model: str, sampling: dict, step: int) -> Turn:
        kw = request_args(sampling, _RESPONSES_ARGS)
        if self.tools:
            kw["tools"] = [{"type": "function", **t["function"]} for t in self.tools]
        resp = await client.responses.create(model=model, input=self.items, **kw)
        text = resp.output_text
        calls = [native_call(o.call_id, o.name, o.arguments) for o in resp.output if o.type == "function_call"]
        self._reply = [o.model_dump(exclude_none=True) for o in resp.output]
        reason = getattr(resp.incomplete_details, "reason", None)
        usage = (resp.usage.input_tokens, resp.usage.output_tokens) if resp.usage else None
        return Turn(
            text,
            calls or parse_tool_calls(text, step),
            resp.status == "incomplete" and reason == "max_output_tokens",
            usage,
        )

    def add_reply(self) -> None:
        self.items += self._reply

    def add_result(self, call_id: str, result: str) -> None:
        self.items.append({"type": "function_call_output", "call_id": call_id, "output": result})

    def add_user(self, text: str) -> None:
        self.items.append({"role": "user", "content": text})


Conversation = Union[ChatConversation, ResponsesConversation]


class HostedAgent(EnvironmentAgent):
    def __init__(
        self,
        env: Environment,
        settings: Settings,
        loop_settings: Optional[AgentSettings] = None,
        replicas: Optional[Replicas] = None,
    ):
        if settings.policy_kind not in ("chat", "responses"):
            raise ValueError(f"HostedAgent serves policy_kind chat or responses, not {settings.policy_kind!r}")
        self.env = env
        self.kind = settings.policy_kind
        self.settings = loop_settings or env.agent
        self.tools: dict[str, Tool] = {t.name: t for t in env.tools()}
        self.schemas = [t.schema() for t in self.tools.values()]
        self.replicas = replicas or Replicas(settings)

    async def close_policy(self) -> None:
        await self.replicas.aclose()

    async def run(self, task: Task, ctx: AgentContext) -> Rollout:
        row, params, messages, followups = read_row(self.env, task.row)
        tools = params.get("tools") or self.schemas
        convo: Conversation = (ChatConversation if self.kind == "chat" else ResponsesConversation)(messages, tools)
        state = self.env.new_state(row)
        sampling = sampling_for(task, self.settings.sampling)
        replica = self.replicas.pick()
        loop = self.settings.loop

        output: list[dict] = []
        calls_made: list[dict] = []
        metrics: dict[str, Any] = {"turns": 0, "tool_calls": 0, "tool_errors": 0, "bad_tool_calls": 0}
        tokens: Optional[list[int]] = None  # prompt, completion: summed when the server reports usage
        timings = Timings()
        truncated = False
        final_text = ""
        for step in range(self.settings.max_steps):
            t0 = time.perf_counter()
            try:
                turn = await self.replicas.ask(replica, convo, sampling, step)
            except ContextOverflow:
                truncated = True
                break
            finally:
                timings.model_s += time.perf_counter() - t0
            metrics["turns"] += 1
            if turn.usage is not None:
                tokens = [a + (b or 0) for a, b in zip(tokens or [0, 0], turn.usage)]
            final_text = turn.text
            if turn.text or not turn.calls or loop == "single_turn":
                output.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": turn.text}]}
                )
            if turn.truncated:
                truncated = True
                break
            convo.add_reply()

            added = False
            if loop != "single_turn" and turn.calls:
                t1 = time.perf_counter()
                await self._run_tools(turn.calls, state, convo, output, calls_made, metrics)
                timings.tools_s += time.perf_counter() - t1
                added = True
            if not added and loop == "multi_turn" and followups:
                text = followups.pop(0)
                convo.add_user(text)
                output.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
                added = True
            if not added or step == self.settings.max_steps - 1:
                metrics["hit_max_steps"] = added
                break

        if tokens is not None:
            metrics.update(prompt_tokens=tokens[0], completion_tokens=tokens[1])
        transcript = Transcript(final_text=final_text, output=output, tool_calls=calls_made, truncated=truncated)
        return await scored(
            self.env,
            task,
            row,
            state,
            transcript,
            self.settings.verify_timeout_s,
            metrics,
            timings,
            trace=None,
            trainable=False,
        )

    async def _run_tools(
        self, calls: list[Call], state: Any, convo: Conversation, output: list, calls_made: list, metrics: dict
    ) -> None:
        """Run each call; every result (or error) goes back to the model and into the output items."""
        for call in calls:
            result = await run_call(call, self.tools, state, self.settings.tool_timeout_s, output, calls_made, metrics)
            convo.add_result(call.call_id, result)
