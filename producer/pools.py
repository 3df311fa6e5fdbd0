"""The worker pools `farm collect --embedded` starts for a one-command run on a laptop.

Redis (the configured one, or the embedded one), the policy when an agent calls one (the
FARM_POLICY_URLS servers, or SmolLM2 on the embedded vLLM, as `farm demo` does), and one
`farm worker --agent NAME` pool per agent in the input, each logging to
<data_dir>/logs/collect-worker-NAME.log: a `LocalStack`. The collection starts once every
worker has announced itself, and the pools are stopped with SIGTERM (drain, then exit) at the end.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from farm.settings import Settings


@contextmanager
def embedded_workers(
    settings: Settings, agents: list[str], processes: int = 1, concurrency: Optional[int] = None
) -> Iterator[Settings]:
    """Redis (configured or embedded), the policy when an agent needs one, and one worker pool per agent."""
    from workers.loops.agent import available_agents
    from workers.supervise.stack import LocalStack, Pool, ServePolicy

    builtin = set(available_agents())
    needs_policy = any(a not in builtin for a in agents)
    serve = ServePolicy(log_name="vllm-collect.log") if needs_policy and not settings.policy_urls else None
    pools = [Pool(agent, processes, concurrency) for agent in agents]
    with LocalStack(settings, pools, policy=serve, log_prefix="collect-worker") as stack:
        yield stack.settings
