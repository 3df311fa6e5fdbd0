"""Wire schema: round trips, packed token arrays, and strict decoding (pure unit tests)."""

import msgspec
import pytest

from farm import schema
from farm.errors import MalformedEntry, UnknownSchemaVersion
from farm.schema import ErrorKind, Rollout, Status, Task, TokenTrace


def make_task(**kw) -> Task:
    return Task.new(run_id="r1", agent="noop", row={"x": 1}, reply_to="farm:results:r1", **kw)


def test_task_round_trip_through_stream_entry():
    task = make_task(sample_index=3, policy_version=7, timeout_s=30)
    fields = schema.entry(task)
    assert set(fields) == {b"v", b"d"}
    back = schema.decode_task(fields)
    assert back == task
    assert back.deadline == pytest.approx(task.created_at + 30)


def test_token_trace_packs_little_endian_and_round_trips():
    n = 8192
    trace = TokenTrace.build(range(100), range(n), [-0.25] * n, [1] * (n - 2) + [0, 0], [(0, n - 2)])
    assert trace.completion_ids[:8] == (0).to_bytes(4, "little") + (1).to_bytes(4, "little")
    assert len(trace.logprobs) == 4 * n
    rollout = Rollout.for_task(make_task(), status=Status.ok, reward=1.0, trace=trace)
    back = schema.decode_rollout(schema.entry(rollout))
    assert list(back.trace.completion()) == list(range(n))
    assert list(back.trace.prompt()) == list(range(100))
    assert back.trace.completion_logprobs()[5] == pytest.approx(-0.25)
    assert back.trace.mask()[-2:] == [0, 0]
    assert back.trace.turns == [(0, n - 2)]


def test_trace_with_mismatched_lengths_is_rejected():
    with pytest.raises(ValueError, match="logprobs"):
        TokenTrace.build([1], [1, 2, 3], [-0.1, -0.2], [1, 1, 1])
    with pytest.raises(ValueError, match="env_mask"):
        TokenTrace.build([1], [1, 2], [-0.1, -0.2], [1])


def test_decoding_rejects_a_wire_trace_with_mismatched_lengths():
    rollout = Rollout.for_task(make_task(), status=Status.ok, reward=0.0)
    raw = msgspec.msgpack.decode(schema.encode(rollout))
    raw["trace"] = {
        "prompt_ids": b"",
        "completion_ids": b"\x01\x00\x00\x00",
        "logprobs": b"",
        "env_mask": b"\x01",
        "turns": [],
    }
    with pytest.raises(MalformedEntry, match="logprobs"):
        schema.decode_rollout({b"v": b"1", b"d": msgspec.msgpack.encode(raw)})


def test_failed_rollout_requires_an_error():
    with pytest.raises(ValueError):
        Rollout.for_task(make_task(), status=Status.failed)
    r = Rollout.failure(make_task(), ErrorKind.timeout, "too slow")
    assert r.error.kind == "timeout" and not r.ok and r.reward is None


@pytest.mark.parametrize(
    "fields, match",
    [
        ({b"v": b"1"}, "lacks"),
        ({b"d": b"x"}, "lacks"),
        ({b"v": b"1", b"d": b"\xc1not msgpack"}, "bad task"),
        ({b"v": b"1", b"d": msgspec.msgpack.encode({"task_id": 5})}, "bad task"),
        ({b"v": b"1", b"d": msgspec.msgpack.encode([1, 2, 3])}, "bad task"),
    ],
)
def test_malformed_entries_raise_malformed(fields, match):
    with pytest.raises(MalformedEntry, match=match):
        schema.decode_task(fields)


def test_unknown_fields_are_rejected():
    raw = msgspec.msgpack.decode(schema.encode(make_task()))
    raw["surprise"] = 1
    with pytest.raises(MalformedEntry, match="surprise"):
        schema.decode_task({b"v": b"1", b"d": msgspec.msgpack.encode(raw)})


def test_unknown_schema_version_is_its_own_error():
    fields = schema.entry(make_task())
    fields[b"v"] = b"99"
    with pytest.raises(UnknownSchemaVersion, match="99"):
        schema.decode_task(fields)


def test_salvage_reads_identity_from_entries_strict_decoding_rejects():
    task = make_task()
    raw = msgspec.msgpack.decode(schema.encode(task))
    raw["row"] = "not a dict"
    info = schema.salvage({b"v": b"2", b"d": msgspec.msgpack.encode(raw)})
    assert info["task_id"] == task.task_id and info["reply_to"] == task.reply_to
    assert schema.salvage({b"v": b"1", b"d": b"\xc1"}) == {}


def test_error_kinds_print_as_plain_words():
    assert str(ErrorKind.max_attempts) == "max_attempts"
    assert f"{Status.truncated}" == "truncated"


def test_a_task_and_a_rollout_written_before_history_existed_still_decode():
    """Entries in Redis from before Task.history and Rollout.history (no such key) decode, with none."""
    task = make_task()
    raw = msgspec.msgpack.decode(schema.encode(task))
    del raw["history"]
    old = schema.decode_task({b"v": b"1", b"d": msgspec.msgpack.encode(raw)})
    assert old.history == [] and old == task
    rollout = Rollout.for_task(task, status=Status.ok, reward=1.0)
    raw = msgspec.msgpack.decode(schema.encode(rollout))
    del raw["history"]
    back = schema.decode_rollout({b"v": b"1", b"d": msgspec.msgpack.encode(raw)})
    assert back.history == [] and back == rollout


def test_a_tasks_attempt_history_round_trips_and_rides_on_its_rollout():
    earlier = [
        schema.Attempt(attempt=1, worker="w-1", at=100.5, kind="agent_error", error="boom"),
        schema.Attempt(attempt=2, worker="w-2", at=101.0, kind="timeout", error="too slow"),
    ]
    task = msgspec.structs.replace(make_task(), attempt=3, history=earlier)
    back = schema.decode_task(schema.entry(task))
    assert back.history == earlier and back.history[1].worker == "w-2"
    rollout = schema.decode_rollout(schema.entry(Rollout.for_task(back, status=Status.ok, reward=1.0)))
    assert rollout.history == earlier and rollout.attempt == 3
    failed = Rollout.failure(back, ErrorKind.agent_error, "gave up")
    assert failed.history == earlier
    raw = msgspec.msgpack.decode(schema.encode(task))
    raw["history"][0]["surprise"] = 1
    with pytest.raises(MalformedEntry, match="surprise"):
        schema.decode_task({b"v": b"1", b"d": msgspec.msgpack.encode(raw)})
