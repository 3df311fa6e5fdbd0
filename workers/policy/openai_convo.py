"""The openai backend's conversations: what one rollout sends (chat messages or Responses items).

  chat       client.chat.completions.create; tool calls from the message's `tool_calls`, or,
             when it has none, Hermes `<tool_call>` tags in the text (what small models write
             when the server has no tool parser); results go back as `role: tool` messages.
  responses  client.responses.create; `function_call` items -> tools -> `function_call_output`.

Rollouts made here carry the conversation, the reward and the metrics, but no token ids
(trace None, trainable False): the trainer refuses them rather than train on re-tokenized
text. Token counts are the server's usage, summed over the turns, when it reports them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Optional, Union

from farm.errors import RolloutFailure
from farm.schema import ErrorKind
from workers.policy.chat import TOOL_SYSTEM, BadToolCall, ToolCall, parse_tool_calls
from workers.policy.protocol import Call, Turn

if TYPE_CHECKING:
    import openai

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


class TextConversation:
    """What both kinds share: the tools (moved into the prompt for servers without a tool
    parser), the summed usage, and no token trace."""

    def __init__(self, tools: list[dict]):
        self.tools = tools  # chat-style
        self.usage: Optional[list[int]] = None  # prompt, completion: summed when the server reports them

    def add_usage(self, turn: Turn) -> None:
        if turn.usage is not None:
            self.usage = [a + (b or 0) for a, b in zip(self.usage or [0, 0], turn.usage)]

    def token_metrics(self) -> dict[str, Any]:
        if self.usage is None:
            return {}
        return {"prompt_tokens": self.usage[0], "completion_tokens": self.usage[1]}

    def rollout_fields(self) -> dict[str, Any]:
        return {"trace": None, "trainable": False}


class ChatConversation(TextConversation):
    def __init__(self, messages: list[dict], tools: list[dict]):
        super().__init__(tools)
        self.messages = list(messages)

    def prompt_tools(self) -> None:
        if self.tools:
            self.messages, self.tools = tools_in_system(self.messages, self.tools), []

    async def turn(
        self, client: openai.AsyncOpenAI, model: str, sampling: dict, step: int, headers: Optional[dict] = None
    ) -> Turn:
        kw = request_args(sampling, _CHAT_ARGS)
        if headers:
            kw["extra_headers"] = headers
        if self.tools:
            kw["tools"] = self.tools
        resp = await client.chat.completions.create(model=model, messages=self.messages, **kw)
        if not resp.choices:
            raise RolloutFailure(ErrorKind.policy, "the policy answered without choices", retryable=True)
        choice = resp.choices[0]
        text = choice.message.content or ""
        native = [tc for tc in choice.message.tool_calls or [] if getattr(tc, "function", None) is not None]
        calls = [native_call(tc.id, tc.function.name, tc.function.arguments) for tc in native]
        reply: dict[str, Any] = {"role": "assistant", "content": text}
        if native:
            reply = {
                "role": "assistant",
                "content": choice.message.content,
                "tool_calls": [tc.model_dump(exclude_none=True) for tc in native],
            }
        usage = (resp.usage.prompt_tokens, resp.usage.completion_tokens) if resp.usage else None
        calls = calls or parse_tool_calls(text, step)
        return Turn(text, calls, truncated=choice.finish_reason == "length", usage=usage, reply=reply)

    def add_reply(self, turn: Turn) -> None:
        self.add_usage(turn)
        self.messages.append(turn.reply)

    def extend(self, messages: list[dict]) -> None:
        self.messages += messages


class ResponsesConversation(TextConversation):
    def __init__(self, messages: list[dict], tools: list[dict]):
        super().__init__(tools)
        self.items = [{"role": m["role"], "content": m["content"]} for m in messages]

    def prompt_tools(self) -> None:
        if self.tools:
            self.items, self.tools = tools_in_system(self.items, self.tools), []

    async def turn(
        self, client: openai.AsyncOpenAI, model: str, sampling: dict, step: int, headers: Optional[dict] = None
    ) -> Turn:
        kw = request_args(sampling, _RESPONSES_ARGS)
        if headers:
            kw["extra_headers"] = headers
        if self.tools:
            kw["tools"] = [{"type": "function", **t["function"]} for t in self.tools]
        resp = await client.responses.create(model=model, input=self.items, **kw)
        text = resp.output_text
        calls = [native_call(o.call_id, o.name, o.arguments) for o in resp.output if o.type == "function_call"]
        reason = getattr(resp.incomplete_details, "reason", None)
        usage = (resp.usage.input_tokens, resp.usage.output_tokens) if resp.usage else None
        return Turn(
            text,
            calls or parse_tool_calls(text, step),
            truncated=resp.status == "incomplete" and reason == "max_output_tokens",
            usage=usage,
            reply=[o.model_dump(exclude_none=True) for o in resp.output],
        )

    def add_reply(self, turn: Turn) -> None:
        self.add_usage(turn)
        self.items += turn.reply

    def extend(self, messages: list[dict]) -> None:
        for m in messages:
            if m["role"] == "tool":
                output = {"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}
                self.items.append(output)
            else:
                self.items.append({"role": m["role"], "content": m["content"]})


OpenAIConversation = Union[ChatConversation, ResponsesConversation]
