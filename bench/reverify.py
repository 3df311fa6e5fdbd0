"""What `farm reverify` costs: rollouts/s re-scoring 10,000 stored rollouts, and 0 policy calls.

The stored rollouts are made offline, no model involved: rows from `math` and
`single_tool_call`'s own generate(), each with a scripted answer (half right, half wrong; for
single_tool_call a recorded get_weather call for the asked city or another one), written as
`farm collect` lines by verifier version "0" whose stored reward is wrong on every tenth line
(the bug a new verifier fixes). `math` scores in its CPU pool (math-verify in pool processes),
`single_tool_call` replays each recorded tool call on a fresh state and scores inline.

The re-scoring runs twice in this process, `farm reverify`'s own function (producer/reverify.py)
with its progress off (the input is written by a child process, so no environment is imported
before the first run): the first run pays the environments' imports (math-verify, sympy) and
the CPU pools' start, the warm run only the pools' start. The settings name a policy, a workers/policy/stub
process; its request count is read before and after: re-scoring must leave it at 0.

    python bench/reverify.py [--rollouts 10000] [--concurrency 64]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from farm.schema import AgentRef, Rollout, Status  # noqa: E402
from farm.settings import load_settings  # noqa: E402
from producer.output import rollout_record  # noqa: E402
from producer.reverify import ReverifyOptions, render, run_reverify  # noqa: E402
from workers.policy.stub import Script, StubProcess  # noqa: E402


def message(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def stored(i: int, agent: str, row: dict, output: list[dict], right: bool) -> dict:
    """One `farm collect` line, scored by version "0": its reward is wrong on every tenth line."""
    reward = float(right) if i % 10 else float(not right)
    rollout = Rollout(
        task_id=f"bench:{i}:0",
        run_id="bench",
        group_id=f"bench:{i}",
        agent_ref=AgentRef(name=agent),
        status=Status.ok,
        reward=reward,
        output=output,
        verifier_version="0",
    )
    return {
        "row_index": i,
        "repeat_index": 0,
        "num_repeats": 1,
        "line": i + 1,
        "agent": agent,
        "run_id": "bench",
        "task_id": rollout.task_id,
        "submitted_at": 0.0,
        "row": row,
        "rollout": rollout_record(rollout),
    }


def write_input(path: Path, n: int) -> None:
    from envs import math as math_env
    from envs import single_tool_call

    half = n // 2
    with open(path, "w") as f:
        for i, row in enumerate(math_env.generate(half, seed=1)):
            right = i % 2 == 0
            answer = row["expected_answer"] if right else f"{row['expected_answer']}+1"
            line = stored(i, "math", row, [message(f"So the answer is \\boxed{{{answer}}}.")], right)
            f.write(json.dumps(line) + "\n")
        for j, row in enumerate(single_tool_call.generate(n - half, seed=1)):
            right = j % 2 == 0
            city = row["expected_city"] if right else "Atlantis"
            call = {
                "type": "function_call",
                "call_id": f"c{j}",
                "name": "get_weather",
                "arguments": json.dumps({"city": city}),
            }
            result = {"type": "function_call_output", "call_id": f"c{j}", "output": "{}"}
            output = [call, result, message(f"The weather in {city} is fine.")]
            f.write(json.dumps(stored(half + j, "single_tool_call", row, output, right)) + "\n")


def model_requests(stub: StubProcess) -> int:
    return sum(v for k, v in stub.stats().items() if k.startswith("POST "))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=int, default=10_000)
    p.add_argument("--concurrency", type=int, default=64, help="farm reverify --concurrency")
    p.add_argument("--write-input", type=Path, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.write_input is not None:  # in a child, so that this process imports no environment before its first run
        write_input(args.write_input, args.rollouts)
        return 0
    with tempfile.TemporaryDirectory(prefix="bench-reverify-") as tmp:
        tmp_path = Path(tmp)
        inp = tmp_path / "rollouts.jsonl"
        subprocess.run(
            [sys.executable, __file__, "--write-input", str(inp), "--rollouts", str(args.rollouts)], check=True
        )
        print(f"input: {args.rollouts:,} stored rollouts, {inp.stat().st_size / 2**20:.1f} MiB", flush=True)
        stub = StubProcess(Script(token_replies=[[1, 2]], model="stub", max_model_len=2048), workdir=tmp_path).start()
        try:
            settings = load_settings(env={}, overrides={"policy_urls": [stub.url]})
            results = []
            for label in ("first", "warm"):
                options = ReverifyOptions(
                    input=inp,
                    output=tmp_path / "new.jsonl",
                    concurrency=args.concurrency,
                    overwrite=True,
                    progress=False,
                )
                t0 = time.perf_counter()
                summary = run_reverify(settings, options)
                wall = time.perf_counter() - t0
                if summary["exit_code"] != 0 or summary["written_now"] != args.rollouts:
                    raise SystemExit(f"farm reverify: exit {summary['exit_code']}, {summary['written_now']} written")
                results.append(
                    {"run": label, "rollouts": args.rollouts, "wall_s": wall, "rollouts_per_s": args.rollouts / wall}
                )
            calls = model_requests(stub)
        finally:
            stub.stop()
    print(render(summary["agents"], title="per environment (warm run)"))
    print(f"{'run':>6} {'rollouts':>9} {'wall s':>8} {'rollouts/s':>11}")
    for r in results:
        print(f"{r['run']:>6} {r['rollouts']:>9,} {r['wall_s']:>8.2f} {r['rollouts_per_s']:>11,.0f}")
    print(f"policy requests during both runs: {calls}")
    print(json.dumps({"bench": "reverify", "results": results, "policy_requests": calls, "agents": summary["agents"]}))
    return 0 if calls == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
