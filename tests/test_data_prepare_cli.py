"""`farm data prepare` on a file with bad rows: one line per bad row, each naming its line number,
then one summary line, and exit 2 (bad input) as before; nothing written."""

import json

from farm.cli import main

GOOD = {"responses_create_params": {"input": "2+2?"}, "agent_ref": {"name": "mcqa"}}


def prepare(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(["data", "prepare", *argv, "--no-check-agents"])
    return code, capsys.readouterr().err.splitlines()


def test_each_bad_row_is_a_line_of_its_own_then_the_summary(tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps(GOOD) + "\nnot json\n" + json.dumps({"foo": 1}) + "\n" + json.dumps(GOOD) + "\n")
    out = tmp_path / "out.jsonl"
    code, lines = prepare(capsys, str(src), "-o", str(out))
    assert code == 2
    assert len(lines) == 3, lines
    assert lines[0].startswith(f"{src}: line 2: invalid JSON")
    assert lines[1].startswith(f"{src}: line 3: missing `responses_create_params`")
    assert lines[2] == f"farm: {src}: 2 rows invalid; nothing written"
    assert not out.exists()


def test_more_bad_rows_than_are_listed_are_counted_on_a_line(tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text("".join("{}\n" for _ in range(25)))
    code, lines = prepare(capsys, str(src), "-o", str(tmp_path / "out.jsonl"))
    assert code == 2
    listed = [line for line in lines if ": line " in line]
    assert [line.split(": line ")[1].split(":")[0] for line in listed] == [str(n) for n in range(1, 21)]
    assert lines[-2:] == [f"{src}: ... and 5 more invalid lines", f"farm: {src}: 25 rows invalid; nothing written"]


def test_an_error_without_bad_rows_is_still_one_line(tmp_path, capsys):
    src = tmp_path / "rows.jsonl"
    src.write_text("")
    code, lines = prepare(capsys, str(src), "-o", str(tmp_path / "out.jsonl"))
    assert code == 2 and lines == [f"farm: {src}: no rows"]
