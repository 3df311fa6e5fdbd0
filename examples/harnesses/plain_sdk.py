"""A plain openai SDK tool-calling loop: the shape most hand-written agents have.

Nothing in it knows the farm: it takes a client and a task, calls Chat Completions with the
environment's tools, runs each tool call, and returns the model's last answer. In a workers config:

    agents:
      weather_sdk:
        harness: examples.harnesses.plain_sdk:run
        env: single_tool_call
"""

from __future__ import annotations


async def run(client, task) -> str | None:
    messages = list(task.messages)
    answer = None
    for _ in range(task.limits["max_steps"]):
        response = await client.chat.completions.create(model=task.model, messages=messages, tools=task.tools or None)
        message = response.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        answer = message.content
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result = await task.call_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return answer
