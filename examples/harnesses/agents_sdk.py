"""An OpenAI Agents SDK agent (`openai-agents`), unchanged: its function tools call the environment.

The SDK runs its own loop over the Responses API (its default model class), with the client it is
given; each of the environment's tools becomes a FunctionTool whose body is `task.call_tool`.
Tracing is off: it would upload traces to OpenAI, and rollouts are recorded by the farm anyway.

    agents:
      weather_agents_sdk:
        harness: examples.harnesses.agents_sdk:run
        env: single_tool_call
"""

from __future__ import annotations

from agents import Agent, FunctionTool, OpenAIResponsesModel, Runner, set_tracing_disabled
from agents.exceptions import MaxTurnsExceeded

set_tracing_disabled(True)


def _tool(spec: dict, task) -> FunctionTool:
    fn = spec["function"]

    async def invoke(ctx, arguments: str) -> str:
        return await task.call_tool(fn["name"], arguments)

    return FunctionTool(
        name=fn["name"],
        description=fn.get("description", ""),
        params_json_schema=fn.get("parameters", {"type": "object", "properties": {}}),
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


async def run(client, task) -> str | None:
    system = "\n".join(m["content"] for m in task.messages if m["role"] == "system")
    conversation = [{"role": m["role"], "content": m["content"]} for m in task.messages if m["role"] != "system"]
    agent = Agent(
        name="farm-agent",
        instructions=system or None,
        tools=[_tool(t, task) for t in task.tools],
        model=OpenAIResponsesModel(model=task.model, openai_client=client),
    )
    try:
        result = await Runner.run(agent, conversation, max_turns=task.limits["max_steps"])
    except MaxTurnsExceeded:
        return None  # the farm counts the turns itself; the verifier reads what the tools did
    return result.final_output
