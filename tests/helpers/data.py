"""Rows as the tests write them: an environment's typed Row from a dict, the trainer's noop rows."""

from __future__ import annotations


def as_row(env, row):
    """`row` (a dict of ground truth, with or without a prompt) as the environment's typed Row,
    the way the worker hands it to `new_state` and `verify`."""
    if not isinstance(row, dict):
        return row
    return env.check_row({"responses_create_params": {"input": "question"}, **row})


def trainer_row(i: int, **spec) -> dict:
    """A NeMo Gym row for the `noop` agent, steered by `spec` (reward, tokens, sleep_s, fail)."""
    return {
        "responses_create_params": {"input": [{"role": "user", "content": f"question {i}"}]},
        "agent_ref": {"type": "responses_api_agents", "name": "noop"},
        "noop": spec,
    }
