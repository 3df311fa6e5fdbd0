"""OpenAI's request shapes at the gateway: requests read into one form, and errors in OpenAI's shape.

Both APIs are read into one `Request` (canonical messages, chat-form tools, a token cap), so the
bridge and the call path never see which API a harness speaks:

  Chat Completions   messages (system, user, assistant with tool_calls, tool) and tools;
  Responses          instructions + input items (messages, function_call, function_call_output;
                     reasoning items are skipped), or a string; previous_response_id continues a
                     response this rollout got. An assistant message item and the function_call
                     items right after it are one assistant turn, as the gateway answered them.

`PARAMETERS` is the table of what the gateway does with each request key (the docs print it):
`honoured` keys steer the call; `imposed` keys are the task's (its sampling is the run's, not the
harness's); `ignored` keys are harmless ones SDKs always send; `refused` values it cannot honour
are a 400 in OpenAI's error shape. Keys in no row are ignored.

The answers, written back in either API's shape, are workers/gateway/answers.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from workers.gateway.bridge import BadHistory, Message, canonical_arguments, chat_message, text_of

PARAMETERS: dict[str, tuple[str, str]] = {
    "model": ("honoured", "must name the served model (task.model); another name is a 404 model_not_found"),
    "messages / input / instructions": ("honoured", "the history; matched against the rollout's chains"),
    "tools": ("honoured", "function tools, rendered by the chat template (Hermes text for SmolLM2)"),
    "tool_choice": ("honoured", '"auto" or none/null; "none" returns tool-call text unparsed'),
    "max_tokens / max_completion_tokens / max_output_tokens": (
        "honoured",
        "capped by the task's max_tokens, the rollout's token budget and the context left",
    ),
    "n": ("honoured", "1 only; n > 1 is refused"),
    "stream, stream_options.include_usage": ("honoured", "server-sent events, sent once the call has its answer"),
    "previous_response_id": ("honoured", "a response of this rollout (Responses API)"),
    "temperature, top_p, seed, stop": ("imposed", "the task's sampling is used; the request's values are ignored"),
    "store, metadata, user, parallel_tool_calls, service_tier, prompt_cache_key, safety_identifier, "
    "truncation, include, logprobs, top_logprobs, reasoning, reasoning_effort, verbosity": (
        "ignored",
        "harmless: they change nothing a rollout records",
    ),
    "response_format / text.format": ("refused", "anything but text (json_object, json_schema) cannot be enforced"),
    'tool_choice "required" or a named tool': ("refused", "cannot be enforced on sampled text"),
    "frequency_penalty, presence_penalty, logit_bias": (
        "refused",
        "non-zero values would change the policy's logprobs",
    ),
    "functions, function_call, audio, modalities (non-text), background, prompt, conversation": (
        "refused",
        "not supported",
    ),
}


class GatewayError(Exception):
    """An answer in OpenAI's error shape: status, message, type, code and param."""

    def __init__(self, status: int, message: str, code: str = "", type_: str = "invalid_request_error", param=None):
        super().__init__(message)
        self.status, self.message, self.code, self.type, self.param = status, message, code, type_, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code or None}}


def bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, code, param=param)


@dataclass
class Request:
    """A call, whichever API it came through."""

    api: str  # "chat" or "responses"
    model: str
    messages: list[Message]
    tools: list[dict]  # chat form: {"type": "function", "function": {...}}
    max_tokens: Optional[int]
    parse_calls: bool
    stream: bool
    include_usage: bool
    previous_response_id: Optional[str] = None


def _refuse_unhonourable(body: dict) -> None:
    if body.get("n") not in (None, 1):
        raise bad("n > 1 is not supported: each call is one sample of the rollout", "n")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise bad(f"{key} would change the policy's logprobs; the gateway samples with the task's sampling", key)
    if body.get("logit_bias"):
        raise bad("logit_bias would change the policy's logprobs", "logit_bias")
    for key in ("functions", "function_call", "audio", "prompt", "conversation"):
        if body.get(key):
            raise bad(f"{key} is not supported by the farm's gateway", key, "unsupported_parameter")
    if body.get("background"):
        raise bad("background responses are not supported", "background", "unsupported_parameter")
    modalities = body.get("modalities")
    if modalities and list(modalities) != ["text"]:
        raise bad("only text output is supported", "modalities", "unsupported_parameter")
    fmt, text = body.get("response_format"), body.get("text")
    if fmt is None and isinstance(text, dict):
        fmt = text.get("format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise bad(f"response format {fmt.get('type')!r} cannot be enforced; only text", "response_format")


def _tool_choice(body: dict) -> bool:
    """Whether tool calls are parsed: tool_choice auto (default) or none."""
    choice = body.get("tool_choice")
    if choice in (None, "auto"):
        return True
    if choice == "none":
        return False
    raise bad(f"tool_choice {str(choice)[:60]!r} cannot be enforced on sampled text; use auto or none", "tool_choice")


def _max_tokens(body: dict, *keys: str) -> Optional[int]:
    for key in keys:
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise bad(f"{key} must be a positive integer", key)
        return value
    return None


def _tools(raw: Any) -> list[dict]:
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        raise bad("tools must be a list", "tools")
    out = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            kind = t.get("type") if isinstance(t, dict) else type(t).__name__
            raise bad(f"tools[{i}]: only function tools are supported, not {str(kind)[:40]!r}", "tools")
        fn = t.get("function", t)
        if not isinstance(fn.get("name"), str):
            raise bad(f"tools[{i}] has no name", "tools")
        spec = {k: fn[k] for k in ("name", "description", "parameters") if fn.get(k) is not None}
        out.append({"type": "function", "function": spec})
    return out


def read_chat(body: dict) -> Request:
    _refuse_unhonourable(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list", "messages", "missing_required_parameter")
    try:
        canon = [chat_message(m, i) for i, m in enumerate(messages)]
    except BadHistory as exc:
        raise bad(str(exc), "messages") from None
    options = body.get("stream_options") or {}
    return Request(
        "chat",
        str(body.get("model", "")),
        canon,
        _tools(body.get("tools")),
        _max_tokens(body, "max_completion_tokens", "max_tokens"),
        _tool_choice(body),
        bool(body.get("stream")),
        bool(isinstance(options, dict) and options.get("include_usage")),
    )


def read_responses(body: dict, earlier: list[Message]) -> Request:
    """A Responses call; `earlier` is the history of its previous_response_id (empty without one)."""
    _refuse_unhonourable(body)
    messages = list(earlier)
    if body.get("instructions") and not earlier:
        messages.append(Message("system", text_of(body["instructions"])))
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append(Message("user", raw))
    elif isinstance(raw, list):
        try:
            messages += _items(raw, messages)
        except BadHistory as exc:
            raise bad(str(exc), "input") from None
    else:
        raise bad("input must be a string or a list of items", "input", "missing_required_parameter")
    if not messages:
        raise bad("input is empty", "input")
    return Request(
        "responses",
        str(body.get("model", "")),
        messages,
        _tools(body.get("tools")),
        _max_tokens(body, "max_output_tokens"),
        _tool_choice(body),
        bool(body.get("stream")),
        True,
        body.get("previous_response_id"),
    )


def _items(items: list, before: list[Message]) -> list[Message]:
    out: list[Message] = []
    joinable = False  # the last message is an assistant turn that function_call items may join
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadHistory(f"input[{i}] must be an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role")
            if role not in ("system", "user", "assistant"):
                raise BadHistory(f"input[{i}].role must be system, developer, user or assistant")
            out.append(Message(role, text_of(item.get("content"))))
            joinable = role == "assistant"
        elif kind == "function_call":
            call = (
                str(item.get("call_id", "")),
                str(item.get("name", "")),
                canonical_arguments(item.get("arguments", "")),
            )
            if joinable and out:
                last = out[-1]
                out[-1] = Message(last.role, last.content, (*last.calls, call))
            else:
                out.append(Message("assistant", "", (call,)))
                joinable = True
        elif kind == "function_call_output":
            out.append(Message("tool", text_of(item.get("output")), call_id=str(item.get("call_id", ""))))
            joinable = False
        elif kind == "reasoning":
            continue
        else:
            raise BadHistory(f"input[{i}]: item type {str(kind)[:40]!r} is not supported")
    return out
