"""A tiny terminal agent: the model gets a `bash` tool, this program runs what it asks, here.

Meant to run inside a rollout's sandbox (`command_in_sandbox: true`, docs/agentic-tasks.md), so
standard library only: nothing can be installed there. It reads the task JSON on stdin (its
`messages`, `model` and `limits`), calls POST {OPENAI_BASE_URL}/chat/completions with one tool,
`bash`, runs each command it is asked for with bash in its working directory (the task's), sends
the result back, and stops at an answer without tool calls (printed: the rollout's final answer)
or after `limits.max_steps` calls (TERMINAL_AGENT_MAX_STEPS when set). The assistant messages go
back as the gateway sent them, so the farm's token trace stays the model's own ids.
"""

import json
import os
import subprocess
import sys
import urllib.request

COMMAND_TIMEOUT_S = 120
OUTPUT_CHARS = 8000
BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a command with bash in the task's working directory; its exit code and output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command line to run."}},
            "required": ["command"],
        },
    },
}


def chat(messages: list, model: str) -> dict:
    body = json.dumps({"model": model, "messages": messages, "tools": [BASH]}).encode()
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
    )
    with urllib.request.urlopen(request, timeout=600) as answer:
        return json.load(answer)["choices"][0]


def bash(command: str) -> str:
    try:
        ran = subprocess.run(
            ["bash", "-c", command], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, errors="replace"
        )
    except subprocess.TimeoutExpired:
        return f"the command ran past {COMMAND_TIMEOUT_S}s and was stopped"
    out = f"exit code {ran.returncode}\nstdout:\n{ran.stdout}\nstderr:\n{ran.stderr}"
    return out if len(out) <= OUTPUT_CHARS else out[:OUTPUT_CHARS] + f"\n[... {len(out) - OUTPUT_CHARS} more chars]"


def result_of(call: dict) -> str:
    if call["function"]["name"] != "bash":
        return f"Error: unknown tool {call['function']['name']!r}; the one tool is bash"
    try:
        command = json.loads(call["function"]["arguments"] or "{}")["command"]
    except (ValueError, KeyError, TypeError) as exc:
        return f"Error: bad arguments for bash: {exc}"
    return bash(command)


def main() -> int:
    task = json.load(sys.stdin)
    messages = list(task["messages"])
    steps = int(os.environ.get("TERMINAL_AGENT_MAX_STEPS") or task.get("limits", {}).get("max_steps") or 20)
    text = ""
    for _ in range(steps):
        choice = chat(messages, task["model"])
        message = choice["message"]
        messages.append(message)
        text = message.get("content") or ""
        if not message.get("tool_calls"):
            break
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result_of(call)})
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
