"""A verifiers 0.4 (`verifiers.v1`) environment run unchanged as a farm command harness.

verifiers 0.4 keeps only its v1 stack: a Taskset yields Tasks (a frozen TaskData row plus the
task's `@vf.reward` methods), an Agent runs a Harness (the program the model plays in) inside a
Runtime, and every model call goes through verifiers' own interception server, which builds the
Trace and then scores it. This script is one such environment, an arithmetic taskset of one task
made from the farm's row, and its rollout: verifiers' interception forwards the model call to the
farm's gateway (an EvalClientConfig on OPENAI_BASE_URL, its key read from OPENAI_API_KEY), so the
farm records the sampled token ids while verifiers scores the reply with its own rewards. The
reward and each reward's score are POSTed to $FARM_TASK_URL/report; the reply is printed.

Offline by construction: the built-in `null` and `bash` harnesses start a chat program that `uv`
provisions from PyPI (and hand it the interception secret on its command line), so this file brings
its own harness, `ReplyHarness`, which makes its one call in process (the Harness contract allows
a harness that runs its loop in process as long as every call goes through the interception
endpoint), on the `subprocess` runtime (a scratch directory on the host; nothing is started in it).

It runs in .venv-verifiers-v1 (`VERIFIERS_VERSION=0.4.0 scripts/verifiers-venv` builds it),
never in the farm's venv, so it imports nothing of the farm. The contract: the task as JSON on
stdin; OPENAI_BASE_URL, OPENAI_API_KEY and FARM_TASK_URL in the environment; the answer on stdout.
A rollout that verifiers records as failed (a reward that raised, a model call refused) exits 1
with verifiers' error on stderr, so the farm keeps it as a failure, never as reward 0.

    .venv-verifiers-v1/bin/python examples/harnesses/verifiers_v1.py < task.json
"""

import asyncio
import json
import os
import re
import sys

import httpx
import verifiers.v1 as vf
from openai import AsyncOpenAI
from verifiers.v1.dialects.chat import message_to_wire

# verifiers loads a harness by id: it imports the module of that name and takes the Harness
# subclass its __all__ exports. This file is that module (see register_harness).
HARNESS_ID = "farm_reply_harness"
__all__ = ["ReplyHarness"]


# -- the taskset: data, reward, loader ---------------------------------------------------------


class ArithmeticData(vf.TaskData):
    answer: str
    """The reference answer, as the farm's row gives it (an integer in text)."""


def reference(answer: str) -> int:
    """The row's answer as a number; a row without one cannot be graded (ValueError)."""
    try:
        return int(answer.strip())
    except ValueError:
        raise ValueError(f"the row's reference answer {answer!r} is not an integer") from None


def last_number(reply: str) -> int | None:
    numbers = re.findall(r"-?\d+", reply)
    return int(numbers[-1]) if numbers else None


class ArithmeticTask(vf.Task[ArithmeticData]):
    @vf.reward
    async def final_number(self, trace: vf.Trace) -> float:
        """1 when the last number of the reply is the answer."""
        return float(last_number(trace.last_reply) == reference(self.data.answer))

    @vf.reward(weight=0.0)
    async def exact_answer(self, trace: vf.Trace) -> float:
        """Recorded with weight 0: the reply is the number and nothing else."""
        return float(trace.last_reply == str(reference(self.data.answer)))


class RowConfig(vf.TasksetConfig):
    """The farm's row: its chat messages (system first, as the farm built them) and its answer."""

    messages: list[dict] = []
    answer: str = ""


class ArithmeticTaskset(vf.Taskset[ArithmeticTask, RowConfig]):
    def load(self) -> list[ArithmeticTask]:
        system = [m["content"] for m in self.config.messages if m["role"] == "system"]
        prompt = [m for m in self.config.messages if m["role"] != "system"]
        data = ArithmeticData(prompt=prompt, system_prompt="\n".join(system) or None, answer=self.config.answer)
        return [ArithmeticTask(data, self.config.task)]


# -- the harness: one chat call through verifiers' interception ---------------------------------


class ReplyHarness(vf.Harness[vf.HarnessConfig]):
    APPENDS_SYSTEM_PROMPT = True  # the system prompt stays a system message
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_) -> vf.ProgramResult:
        system, prompt = self.resolve_prompt(data)
        messages = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [message_to_wire(m) for m in prompt or []]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            reply = await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout=reply.choices[0].message.content or "", stderr="")


def register_harness() -> None:
    """Make this module importable as HARNESS_ID, whether it runs as a script or was imported."""
    sys.modules.setdefault(HARNESS_ID, sys.modules[__name__])


# -- the rollout -------------------------------------------------------------------------------


def agent_config(task: dict) -> vf.AgentConfig:
    """The farm's task as a verifiers agent: model, gateway endpoint, sampling, turn limit."""
    return vf.AgentConfig(
        harness={"id": HARNESS_ID},
        runtime=vf.SubprocessConfig(),
        model=task["model"],
        client=vf.EvalClientConfig(base_url=os.environ["OPENAI_BASE_URL"], api_key_var="OPENAI_API_KEY"),
        sampling=vf.SamplingConfig(**{k: v for k, v in task["sampling"].items() if v is not None}),
        max_turns=task["limits"]["max_steps"],
    )


async def run(task: dict) -> vf.Trace:
    register_harness()
    taskset = ArithmeticTaskset(RowConfig(messages=task["messages"], answer=str(task["row"]["answer"])))
    (one,) = list(taskset)
    return await vf.Agent(agent_config(task)).run(one)


def main() -> None:
    trace = asyncio.run(run(json.load(sys.stdin)))
    if not trace.ok:
        error = trace.last_error
        said = f"verifiers rollout failed: {error.type}: {error.message}" if error else "verifiers rollout failed"
        if error is not None and error.type == "TaskError":  # the task's own code (a @reward) raised: its
            # grader failed, a `verifier` failure the farm does not retry; any other error is a crash (retried)
            httpx.post(os.environ["FARM_TASK_URL"] + "/report", json={"error": said}, timeout=30).raise_for_status()
        sys.exit(said)
    components = {name: r.score for name, r in trace.rewards.items() if r is not None}
    report = {"reward": trace.reward, "components": components}
    httpx.post(os.environ["FARM_TASK_URL"] + "/report", json=report, timeout=30).raise_for_status()
    print(trace.last_reply)


if __name__ == "__main__":
    main()
