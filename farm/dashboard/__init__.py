"""`farm dashboard`: the web UI and the Prometheus endpoint, one module per concern.

- `app`: `create_app(settings)`, which assembles the rest, plus the security headers and the 503
  an unreachable Redis becomes;
- `deps`: the lifespan (opens the Redis client at startup, closes it at shutdown) and what routes
  get through `Depends`: the settings, a `Reader` over that client, the `Pages` renderer, `authorise`;
- `routes_pages` (overview, workers, a rollout, a letter), `routes_agent` and `data_agent` (an
  agent's charts), `routes_runs` and `data_runs` (runs, a run's learning curve, a worker),
  `routes_find` and `data_find` (find by id, a task's attempts, a group side by side, filtered
  and paged lists of rollouts and dead letters), `routes_api`, `routes_actions`: the HTML pages,
  the JSON, the two write actions;
- `metrics`: the Prometheus collector and its `/metrics` route;
- `data`, `charts`: what the pages show, read from Redis only, and its SVG charts.

Nothing is imported here: `data` needs no web framework, so reading it does not load FastAPI.
"""
