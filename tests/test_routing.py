"""Placement over policy replicas (workers/policy/rotation.py): groups start on one replica,
rollouts keep theirs, load spills, a home that leaves hands its group on.

The unit tests drive the rotation directly (placement is arithmetic over counters; no request
is sent). The last two run a real `farm worker` against four real stub replicas and read where
each rollout went from its `replica` metric and the stubs' own request counts, once with group
routing and once with the placement without groups as the control.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict

import pytest
from helpers.processes import stop
from helpers.workers import spawn_worker

from farm.client import FarmClient
from workers.policy import rotation as rotation_module
from workers.policy.config import PolicyConfig
from workers.policy.rotation import Rotation, Session
from workers.policy.stub import Script, StubProcess
from workers.policy.stub import weather_rows as rows
from workers.policy.stub import weather_script as script_for
from workers.policy.tokens import PolicyClient
from workers.supervise.stack import policy_env

URLS = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]


def rotation(routing: str = "group", **kw) -> Rotation:
    return Rotation(PolicyConfig(urls=URLS, model="m", routing=routing, **kw), probes=False)


def place(rot: Rotation, group: str, n: int) -> list[Session]:
    sessions = [Session(group=group, key=f"{group}-{i}") for i in range(n)]
    for s in sessions:
        assert rot.pick(s) is not None
    return sessions


def test_an_idle_farm_starts_each_group_on_one_replica_and_new_groups_where_fewest_are():
    rot = rotation()
    groups = [place(rot, f"g{k}", 8) for k in range(4)]
    homes = [{s.replica.url for s in g} for g in groups]
    assert all(len(h) == 1 for h in homes), homes  # the first group is never split on an idle farm
    assert len(set().union(*homes)) == 4  # each new group went to the replica with the fewest
    assert [r.assigned for r in rot.replicas] == [8, 8, 8, 8]


def test_without_groups_the_samples_of_one_group_spread_over_the_replicas():
    """The control: the placement used before groups (and `routing: least_outstanding`)."""
    rot = rotation("least_outstanding")
    sessions = [Session(group="g0") for _ in range(8)]
    for s in sessions:
        rot.pick(s).outstanding += 1  # each sample's first request is in flight when the next is placed
    assert len({s.replica.url for s in sessions}) == 4


def test_a_rollout_keeps_its_replica_for_every_turn_and_ends_counted_off():
    rot = rotation()
    [s] = place(rot, "g0", 1)
    first = s.replica
    for _ in range(5):
        assert rot.pick(s) is first
    assert first.assigned == 1 and s.moves == 0
    s.end()
    s.end()  # ending twice counts once
    assert first.assigned == 0 and rot._homes["g0"].live == 0


def test_a_crowded_home_spills_later_samples_and_takes_them_back_when_it_clears():
    rot = rotation()
    [first] = place(rot, "g0", 1)
    home = first.replica
    place(rot, "other", 3)  # another group elsewhere
    home.assigned += 20  # long sessions of earlier groups hold the home
    spilled = place(rot, "g0", 2)
    assert all(s.replica is not home for s in spilled)  # 21 - 1 own > 1.5 x mean (25 / 4)
    assert rot._homes["g0"].replica is home  # a spill does not move the group's home
    home.assigned -= 20
    back = place(rot, "g0", 1)[0]
    assert back.replica is home and rot._homes["g0"].live == 2


def test_a_home_that_leaves_rotation_hands_its_group_to_one_other_replica():
    rot = rotation()
    first = place(rot, "g0", 4)
    home = first[0].replica
    rot.replicas[rot.replicas.index(home)].healthy = False  # out of rotation (take_out without a monitor)
    later = place(rot, "g0", 4)
    assert len({s.replica.url for s in later}) == 1 and later[0].replica is not home
    moved = rot.pick(first[0])  # a live sample of the group moves off the replica that left...
    assert moved is later[0].replica and first[0].moves == 1  # ...to the group's new home
    home.healthy = True
    assert {rot.pick(s).url for s in later} == {later[0].replica.url}  # sessions stay where they are


def test_group_homes_are_bounded(monkeypatch):
    monkeypatch.setattr(rotation_module, "GROUPS_KEPT", 16)
    rot = rotation()
    for k in range(100):
        for s in place(rot, f"g{k}", 2):
            s.end()
    assert len(rot._homes) == 16 and "g99" in rot._homes and "g0" not in rot._homes
    assert [r.assigned for r in rot.replicas] == [0, 0, 0, 0]


def test_route_headers_carry_the_group_and_session_keys():
    rot = rotation(route_headers={"X-SMG-Routing-Key": "group", "x-session-id": "session"})
    s = Session(group="g7", key="task-1")
    assert rot.headers(s) == {"X-SMG-Routing-Key": "g7", "x-session-id": "task-1"}
    assert rotation().headers(s) is None


@pytest.mark.slow
async def test_a_home_that_stops_answering_hands_its_group_on_within_two_seconds(tmp_path):
    """A real replica killed under a group: the group's next sample is answered by the other replica
    within 2 s (three refused connections take the home out of rotation), and the samples after it
    start there at once."""
    script = Script(token_replies=[[5, 6, 2]], model="m", max_model_len=2048)
    with (
        StubProcess(script, latency_s=0.01, workdir=tmp_path) as a,
        StubProcess(script, latency_s=0.01, workdir=tmp_path) as b,
    ):
        client = PolicyClient(PolicyConfig(urls=[a.url, b.url], model="m"))
        try:
            first = Session(group="g")
            await client.complete([1, 2, 3], {}, first)
            home, other = (a, b) if first.replica.url == a.url else (b, a)
            home.stop()
            start = time.monotonic()
            second = Session(group="g")
            answer = await client.complete([1, 2, 3], {}, second)
            handed_on = time.monotonic() - start
            third = Session(group="g")
            await client.complete([1, 2, 3], {}, third)
        finally:
            await client.aclose()
    assert answer.replica == other.url and handed_on < 2.0, handed_on
    assert third.replica.url == other.url and third.moves == 0  # placed on the new home directly


@pytest.fixture
def four_stubs(tokenizer, tmp_path):
    stubs = [StubProcess(script_for(tokenizer), latency_s=0.05, workdir=tmp_path).start() for _ in range(4)]
    yield stubs
    for s in stubs:
        s.stop()


def run_groups(settings, stubs, model_dir, routing: str, groups: int = 64, g: int = 8):
    env = policy_env(",".join(s.url for s in stubs), "stub", model_dir)
    before = [s.stats().get("POST /v1/completions", 0) for s in stubs]
    proc = spawn_worker(
        settings, "--agent", "single_tool_call", "--concurrency", "64", FARM_POLICY_ROUTING=routing, **env
    )

    async def main():
        client = FarmClient(settings)
        tasks = [
            client.task(run_id=routing, agent="single_tool_call", row=row, group_id=f"{routing}-g{k}", sample_index=i)
            for k, row in enumerate(rows(groups))
            for i in range(g)
        ]
        try:
            return await client.run_batch(tasks, timeout_s=300)
        finally:
            await client.aclose()

    try:
        got = asyncio.run(main())
    finally:
        out = stop(proc, timeout=60)
    assert proc.returncode == 0, out[-3000:]
    requests = [s.stats().get("POST /v1/completions", 0) - b for s, b in zip(stubs, before)]
    return list(got.values()), requests


@pytest.mark.slow
def test_64_groups_of_8_on_four_replicas_start_together_and_stay(settings, four_stubs, model_dir):
    got, requests = run_groups(settings, four_stubs, model_dir, "group")
    assert len(got) == 512 and all(r.ok for r in got), Counter(r.status for r in got)
    starts: dict[str, set] = defaultdict(set)
    for r in got:
        starts[r.group_id].add(r.metrics["replica"])
    together = sum(len(s) == 1 for s in starts.values()) / len(starts)
    assert together >= 0.90, together
    assert all(r.metrics["replica_moves"] == 0 for r in got)  # every second turn on its first turn's replica
    assert sum(requests) == 2 * 512 and max(requests) / min(requests) <= 1.5, requests

    control, _ = run_groups(settings, four_stubs, model_dir, "least_outstanding")
    spread: dict[str, set] = defaultdict(set)
    for r in control:
        spread[r.group_id].add(r.metrics["replica"])
    assert sum(len(s) == 1 for s in spread.values()) / len(spread) < 0.5  # the test can tell them apart


def test_two_worker_processes_mostly_agree_on_a_groups_home():
    """Each process has its own rotation; the samples of one group fetched by two processes start
    on one replica when the group's id picks the same home among the similarly loaded replicas."""
    first, second = rotation(), rotation()
    live: list[Session] = []
    for k in range(64):
        for i in range(8):  # the group's samples alternate between the processes
            s = Session(group=f"g{k}")
            (first if i % 2 == 0 else second).pick(s)
            live.append(s)
        if len(live) > 64:  # rollouts end as new ones start: each process holds about 32
            for s in live[:8]:
                s.end()
            live = live[8:]
    agree = sum(first._homes[f"g{k}"].replica.url == second._homes[f"g{k}"].replica.url for k in range(64)) / 64
    assert agree >= 0.9, agree
    for rot in (first, second):
        served = Counter(h.replica.url for h in rot._homes.values())
        assert max(served.values()) / min(served.values()) <= 1.5, served
