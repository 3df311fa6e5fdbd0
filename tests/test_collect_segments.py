"""A harness rollout's further token segments in `farm collect`'s output: the same encoding as its
trace (plain lists, not base64 of packed bytes), in JSONL and in Parquet, which used to drop them."""

import json

import msgspec
import pytest

from farm.errors import ErrorKind
from farm.schema import Rollout, Status, Task, TokenTrace
from producer.output import Journal, line_for, read_records, to_parquet

TRACE = TokenTrace.build([1, 2, 3], [10, 11, 12], [-0.5, -0.25, 0.0], [1, 1, 0], [(0, 2)])
SEGMENTS = [
    TokenTrace.build([1, 2, 3, 10, 11, 99], [20, 21], [-1.0, -0.125], [1, 1], [(0, 2)]),
    TokenTrace.build([5], [30], [-2.0], [1], [(0, 1)]),
]
AS_LISTS = [
    {"prompt_ids": [1, 2, 3, 10, 11, 99], "completion_ids": [20, 21], "logprobs": [-1.0, -0.125], "env_mask": [1, 1]},
    {"prompt_ids": [5], "completion_ids": [30], "logprobs": [-2.0], "env_mask": [1]},
]


def rollout_line(segments: list[TokenTrace]) -> bytes:
    task = Task.new(run_id="collect-segments", agent="harness", row={"q": 1}, reply_to="x")
    failed = Rollout.failure(task, ErrorKind.tool, "placeholder")
    rollout = msgspec.structs.replace(failed, status=Status.ok, error=None, reward=1.0, trace=TRACE, segments=segments)
    return line_for(task, rollout, row_index=0, repeat_index=0, num_repeats=1, line=1, submitted_at=0.0)


def test_segments_are_lists_like_the_trace_in_jsonl(tmp_path):
    record = json.loads(rollout_line(SEGMENTS))["rollout"]
    assert record["trace"]["completion_ids"] == [10, 11, 12]
    segments = record["segments"]
    assert [{k: s[k] for k in AS_LISTS[0]} for s in segments] == AS_LISTS
    assert [s["turns"] for s in segments] == [[[0, 2]], [[0, 1]]]
    assert all(set(s) == set(record["trace"]) for s in segments)  # one encoding for both
    # A rollout without further segments has an empty list, not a missing field.
    assert json.loads(rollout_line([]))["rollout"]["segments"] == []


def test_jsonl_and_parquet_round_trips_keep_the_segments(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="the parquet extra (pyarrow) is not installed")
    journal_path = tmp_path / "out.parquet.journal.jsonl"
    journal = Journal(journal_path)
    journal.write([rollout_line(SEGMENTS), rollout_line([])])
    journal.close()
    back = [rec["rollout"]["segments"] for rec in read_records(journal_path)]
    assert [[{k: s[k] for k in AS_LISTS[0]} for s in segs] for segs in back] == [AS_LISTS, []]

    out = tmp_path / "out.parquet"
    assert to_parquet(journal_path, out) == 2
    column = pq.read_table(out).column("segments").to_pylist()
    assert [[{k: s[k] for k in AS_LISTS[0]} for s in segs] for segs in column] == [AS_LISTS, []]
    assert [s["turns"] for s in column[0]] == [[[0, 2]], [[0, 1]]]
