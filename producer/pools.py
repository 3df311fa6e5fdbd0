"""The worker pools `farm collect --embedded` starts for a one-command run on a laptop.

Redis (the configured one, or the embedded one), the policy when an agent calls one (the
FARM_POLICY_URLS servers, or SmolLM2 on the embedded vLLM, as `farm demo` does), and one
`farm worker --agent NAME` pool per agent in the input, each logging to
<data_dir>/logs/collect-worker-NAME.log. The collection starts once every worker has
announced itself, and the pools are stopped with SIGTERM (drain, then exit) at the end.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, contextmanager
from typing import Iterator, Optional

from farm.settings import Settings


@contextmanager
def embedded_workers(
    settings: Settings, agents: list[str], processes: int = 1, concurrency: Optional[int] = None
) -> Iterator[Settings]:
    """Redis (configured or embedded), the policy when an agent needs one, and one worker pool per agent."""
    from farm.embedded import ensure_redis
    from workers.loops.agent import available_agents
    from workers.supervise.up import Pool, start_pools, wait_for_workers

    builtin = set(available_agents())
    needs_policy = [a for a in agents if a not in builtin]
    with ExitStack() as stack:
        s = stack.enter_context(ensure_redis(settings))
        env = dict(os.environ, FARM_REDIS_URL=s.redis_url, FARM_NAMESPACE=s.namespace)
        if needs_policy and not s.policy_urls:
            from workers.policy.serving import PolicyServer, default_cache, prepare_model

            model = prepare_model(default_cache())
            server = stack.enter_context(PolicyServer(model, log_path=s.data_path / "logs" / "vllm-collect.log"))
            env.update(
                FARM_POLICY_URLS=server.url,
                FARM_POLICY_MODEL=server.served_model_name,
                FARM_POLICY_TOKENIZER=str(model),
            )
            s = s.replace(policy_urls=[server.url], policy_model=server.served_model_name, policy_tokenizer=str(model))
        logs = s.data_path / "logs"
        pools = [Pool(agent, processes, concurrency) for agent in agents]
        procs = start_pools(stack, s, pools, env, logs, prefix="collect-worker")
        wait_for_workers(s, len(agents) * processes, procs, logs)
        yield s
