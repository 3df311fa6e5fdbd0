"""The agent interface: what a worker runs for each task, and how agents are found.

An agent turns one Task into one Rollout. It may raise `RolloutFailure(kind, message,
retryable=...)` for failures it understands; any other exception, and running past the
attempt's time limit, counts as a retryable failure. An agent whose model can be unavailable
may also define `ready() -> bool` and `async wait_ready()`: the worker fetches no task while
`ready()` is false. The worker owns delivery (retries,
dead letters, acks); the agent never talks to the queue.

Agents are looked up by name: the built-ins below, then the `farm.agents` entry point group,
so third-party packages plug in the same way the environments do.
"""

from __future__ import annotations

import logging
import os
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Callable

from farm.errors import UnknownAgent
from farm.settings import Settings
from workers.loops.context import Agent, AgentContext

if TYPE_CHECKING:
    from workers.policy.protocol import Policy

__all__ = ["Agent", "AgentContext", "AgentFactory", "available_agents", "known_agents", "load_agent"]

ENTRY_POINT_GROUP = "farm.agents"


AgentFactory = Callable[[str, Settings], Agent]


def _builtins() -> dict[str, AgentFactory]:
    from workers.loops.noop import NoopAgent

    def scripted(mode: str) -> AgentFactory:
        def make(name: str, settings: Settings) -> Agent:
            from workers.loops.scripted import scripted_agent  # the SDK and sandboxes: not for a core install

            return scripted_agent(name, settings, mode)  # type: ignore[arg-type]

        return make

    return {
        "noop": lambda name, settings: NoopAgent(),
        "harbor_oracle": scripted("oracle"),
        "harbor_nop": scripted("nop"),
    }


def available_agents() -> dict[str, AgentFactory]:
    agents = _builtins()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        agents.setdefault(ep.name, ep.load())
    return agents


def load_agent(name: str, settings: Settings, impl: str | None = None) -> Agent:
    """The agent serving stream `name`.

    Looked up in order: a registered agent implementation called `impl` (default: name),
    an agent configured under `agents:` in the settings, an environment registered as `name`.
    """
    agents = available_agents()
    key = impl or name
    if key in agents:
        return agents[key](name, settings)
    from envs.sdk import available_envs

    if impl is None and (name in settings.agents or name in available_envs()):
        return policy_agent(name, settings)
    envs = sorted(available_envs())
    raise UnknownAgent(
        f"unknown agent {key!r}; agents: {', '.join(sorted(agents))}; "
        f"configured: {', '.join(sorted(settings.agents)) or 'none'}; environments: {', '.join(envs) or 'none'}"
    )


def policy_agent(name: str, settings: Settings) -> Agent:
    """The agent for `name`: the agent loop over the policy backend `policy_kind` names (tokens: the
    token client and the model's tokenizer; chat, responses: the openai client)."""
    import dataclasses

    from envs.sdk import load_env
    from farm.errors import ConfigError
    from workers.loops.loop import AgentLoop

    cfg = settings.agents.get(name)
    env = load_env(cfg.env if cfg else name, cfg.env_options if cfg else None)
    loop_settings = env.agent
    if cfg is not None:
        changes = {k: v for k, v in (("loop", cfg.loop), ("max_steps", cfg.max_steps)) if v is not None}
        sampling = {**loop_settings.sampling, **cfg.sampling}
        loop_settings = dataclasses.replace(loop_settings, sampling=sampling, **changes)
    if not settings.policy_urls:
        raise ConfigError(
            f"agent {name!r} calls a policy: set policy_urls (FARM_POLICY_URLS), "
            "e.g. to the URL `farm policy serve` prints"
        )
    agent: Any
    if cfg is not None and (cfg.harness or cfg.command):
        agent = _harness_agent(name, env, loop_settings, cfg, settings)
    else:
        agent = AgentLoop(env, _policy(settings), loop_settings)
    if env.sandboxes:
        from workers.loops.sandboxes import make_backend

        agent.sandboxes = make_backend(settings)
    return agent


def _harness_agent(name: str, env: Any, loop_settings: Any, cfg: Any, settings: Settings) -> Agent:
    """A harness or command agent, through the gateway. It needs token ids in and out, so it is refused
    with the text-only policy kinds instead of training on re-tokenized text."""
    from farm.errors import ConfigError
    from workers.loops.harness import HarnessAgent

    if settings.policy_kind != "tokens":
        raise ConfigError(
            f"agent {name!r} runs a harness through the gateway, which records token ids: it needs "
            f"policy_kind tokens (a vLLM server), not {settings.policy_kind!r}"
        )
    policy = _policy(settings)
    return HarnessAgent(name, env, policy.client, policy.tok, loop_settings, cfg, settings)


def _policy(settings: Settings) -> Policy[Any]:
    from farm.errors import ConfigError
    from workers.policy.config import PolicyConfig

    config = PolicyConfig.from_settings(settings)
    if settings.policy_kind != "tokens":  # text through the openai client: no tokenizer, no token ids
        from workers.policy.openai_pool import OpenAIPolicy

        return OpenAIPolicy(config, settings.policy_kind)
    from workers.policy.chat import ChatTokenizer
    from workers.policy.token_policy import TokenPolicy
    from workers.policy.tokens import PolicyClient

    path = settings.tokenizer_path
    if not settings.policy_tokenizer and not os.path.isdir(path):  # else transformers takes it for a hub repo id
        raise ConfigError(
            f"no tokenizer at {path} (policy_tokenizer is unset, so the tokenizer is the prepared "
            f"model {settings.policy_model!r} under data_dir): run `farm policy prepare`, or set "
            "policy_tokenizer to the served model's directory"
        )
    if settings.policy_tokenizer and os.path.isabs(path) and not os.path.isdir(path):
        raise ConfigError(f"policy_tokenizer {path} is not a directory (a model directory with its tokenizer files)")
    # Seconds of silence otherwise (transformers' import, the tokenizer files); a path that cannot be one
    # failed above in one line, with nothing before it.
    logging.getLogger(__name__).info("loading the policy's tokenizer from %s", path)
    try:
        tokenizer = ChatTokenizer(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"cannot load the tokenizer from {path}: {exc} (set policy_tokenizer, or run `farm policy prepare`)"
        ) from None
    return TokenPolicy(PolicyClient(config), tokenizer)


def known_agents(settings: Settings | None = None) -> set[str]:
    """Names a row's agent_ref may use: registered environments and agents, and configured agents."""
    from envs.sdk import available_envs

    names = set(available_envs()) | set(available_agents())
    if settings is not None:
        names |= set(settings.agents)
    return names
