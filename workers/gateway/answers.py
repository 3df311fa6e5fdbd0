"""OpenAI's answer shapes at the gateway: the model's reply to one call written back as a Chat
Completions answer or a Responses one, whole or as server-sent events (streamed answers are sent
once the call has its answer). The requests they answer are read in workers/gateway/shapes.py.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from workers.gateway.bridge import Message, canonical_arguments


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
