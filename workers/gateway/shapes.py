"""OpenAI's shapes at the gateway: requests read into one form, answers written back, errors.

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
"""

from __future__ import annotations

import time
import uuid
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


# -- answers ---------------------------------------------------------------------------------
@dataclass
class Reply:
    """The model's answer to one call, in the shape both APIs take apart."""

    content: Optional[str]
    calls: list[tuple[str, str, str]]  # (call id, name, JSON arguments)
    finish: str  # stop, length or tool_calls
    prompt_tokens: int
    completion_tokens: int

    def message(self) -> Message:
        return Message("assistant", self.content or "", tuple((c, n, canonical_arguments(a)) for c, n, a in self.calls))


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def chat_answer(reply: Reply, model: str, call_id: str) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in reply.calls
        ]
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish, "logprobs": None}],
        "usage": _chat_usage(reply),
    }


def _chat_usage(reply: Reply) -> dict:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def chat_chunks(reply: Reply, model: str, call_id: str, include_usage: bool) -> list[dict]:
    """The answer as Chat Completions stream chunks (sent once the whole answer is known)."""
    base = {"id": call_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    delta: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None, "logprobs": None}]}]
    if reply.calls:
        calls = [
            {"index": i, "id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for i, (cid, name, args) in enumerate(reply.calls)
        ]
        chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": reply.finish}]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": _chat_usage(reply)})
    return chunks


def response_items(reply: Reply) -> list[dict]:
    items: list[dict] = []
    if reply.content:
        part = {"type": "output_text", "text": reply.content, "annotations": [], "logprobs": []}
        items.append(
            {"type": "message", "id": new_id("msg_"), "status": "completed", "role": "assistant", "content": [part]}
        )
    for cid, name, args in reply.calls:
        items.append(
            {
                "type": "function_call",
                "id": new_id("fc_"),
                "call_id": cid,
                "name": name,
                "arguments": args,
                "status": "completed",
            }
        )
    return items


def response_answer(reply: Reply, model: str, response_id: str, items: list[dict], body: dict) -> dict:
    incomplete = reply.finish == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "incomplete" if incomplete else "completed",
        "model": model,
        "output": items,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": body.get("tools") or [],
        "previous_response_id": body.get("previous_response_id"),
        "text": {"format": {"type": "text"}},
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }


def response_events(answer: dict) -> list[dict]:
    """The answer as Responses stream events, in the order the API sends them."""
    pending = {**answer, "status": "in_progress", "output": [], "usage": None}
    events: list[dict] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for index, item in enumerate(answer["output"]):
        ref = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "content": []},
                },
                {"type": "response.content_part.added", **ref, "content_index": 0, "part": {**part, "text": ""}},
                {
                    "type": "response.output_text.delta",
                    **ref,
                    "content_index": 0,
                    "delta": part["text"],
                    "logprobs": [],
                },
                {"type": "response.output_text.done", **ref, "content_index": 0, "text": part["text"], "logprobs": []},
                {"type": "response.content_part.done", **ref, "content_index": 0, "part": part},
            ]
        else:
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": index,
                    "item": {**item, "status": "in_progress", "arguments": ""},
                },
                {"type": "response.function_call_arguments.delta", **ref, "delta": item["arguments"]},
                {
                    "type": "response.function_call_arguments.done",
                    **ref,
                    "name": item["name"],
                    "arguments": item["arguments"],
                },
            ]
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append(
        {"type": "response.completed" if answer["status"] == "completed" else "response.incomplete", "response": answer}
    )
    for n, event in enumerate(events):
        event["sequence_number"] = n
    return events
