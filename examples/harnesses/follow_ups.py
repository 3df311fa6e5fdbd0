"""The plain openai SDK loop, plus the row's follow-up user turns after each answer.

It answers like the farm's own `multi_turn` loop (tool results while the model calls tools, then
the next of the row's `follow_up_messages`), so a row's later prompts are built by the gateway's
bridge; tests/test_harness_vllm.py and bench/gateway_exact.py compare it with that loop.
"""

from __future__ import annotations


async def run(client, task) -> str | None:
    messages, follow_ups, answer = list(task.messages), list(task.row.get("follow_up_messages", [])), None
    for _ in range(task.limits["max_steps"]):
        choice = (await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools)).choices[
            0
        ]
        messages.append(choice.message.model_dump(exclude_none=True))
        answer = choice.message.content
        if choice.finish_reason == "length":
            break
        for call in choice.message.tool_calls or []:
            result = await task.call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        if not choice.message.tool_calls:
            if not follow_ups:
                break
            messages.append({"role": "user", "content": follow_ups.pop(0)})
    return answer
