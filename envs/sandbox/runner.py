"""Runs inside the sandbox: the candidate program on each input, reporting only what it produced.

Started as `python -I -S -B runner.py FD LIMIT` in the run's directory, which holds job.json
(the program and the test *inputs*; the expected outputs never enter the sandbox). For each
input it writes one JSON line to the report fd: {"i": n, "out": text} where text is what the
program printed (stdin/stdout tests) or the JSON of what the function returned (call-based
tests), or {"i": n, "error": kind}. The parent compares those outputs with the expected ones,
in code the candidate never shares an interpreter with: whatever a program does to this
runner (patching json, walking frames, writing to the report fd, exiting early) it can only
change its own outputs, and it does not know the right ones.

Standard library only, and nothing imported after the program starts that it could have
replaced first.
"""

import io
import json
import os
import sys


class Capped(io.BytesIO):
    """An output buffer that refuses to grow past the limit (a program printing without end)."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.over = limit, False

    def write(self, data) -> int:
        if self.tell() + len(data) > self.limit:
            self.over = True
            raise OSError("output limit")
        return super().write(data)


def main() -> None:
    fd, limit = int(sys.argv[1]), int(sys.argv[2])
    write, dumps, loads = os.write, json.dumps, json.loads

    def emit(record: dict) -> None:
        write(fd, (dumps(record) + "\n").encode())

    with open("job.json") as f:
        job = loads(f.read())
    os.remove("job.json")
    program, inputs, fn_name = job["program"], job["inputs"], job.get("fn_name")
    try:
        code = compile(program, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        emit({"load": f"{type(exc).__name__}: {exc}"[:200]})
        raise SystemExit(4)
    real_stdin, real_stdout = sys.stdin, sys.stdout

    def load(stdin_text: str, stdout) -> dict:
        ns = {"__name__": "__main__", "__builtins__": __builtins__}
        sys.stdin, sys.stdout = io.StringIO(stdin_text), stdout
        try:
            exec(code, ns)
        finally:
            sys.stdin, sys.stdout = real_stdin, real_stdout
        return ns

    if fn_name:
        try:
            fn = load("", io.StringIO()).get(fn_name)
        except MemoryError:
            emit({"load": "memory"})
            raise SystemExit(3)
        if not callable(fn):
            emit({"load": f"no function {fn_name}"})
            raise SystemExit(4)
        _call_each(fn, inputs, emit, loads, dumps, limit)
    else:
        _feed_each(load, inputs, emit, limit)
    emit({"done": True})


def _call_each(fn, inputs: list, emit, loads, dumps, limit: int) -> None:
    """Call-based tests: each input holds the JSON arguments, one per line; the output is the JSON result."""
    for i, text in enumerate(inputs):
        try:
            args = [loads(line) for line in text.split("\n") if line.strip()]
            out = dumps(fn(*args))
        except MemoryError:
            emit({"i": i, "error": "memory"})
            continue
        except BaseException as exc:  # the program's failure on this input
            emit({"i": i, "error": type(exc).__name__})
            continue
        emit({"i": i, "out": out} if len(out) <= limit else {"i": i, "error": "output_limit"})


def _feed_each(load, inputs: list, emit, limit: int) -> None:
    """stdin/stdout tests: the program runs once per input, its printed output captured (capped)."""
    for i, text in enumerate(inputs):
        raw = Capped(limit)
        buf = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", write_through=True)
        error = None
        try:
            load(text, buf)
        except SystemExit as exc:
            error = None if exc.code in (None, 0) else "exit"
        except MemoryError:
            error = "memory"
        except BaseException as exc:
            error = type(exc).__name__
        if raw.over:
            error = "output_limit"
        out = raw.getvalue().decode("utf-8", "replace")
        if error:
            emit({"i": i, "error": error})
        else:
            emit({"i": i, "out": out} if len(out) <= limit else {"i": i, "error": "output_limit"})


if __name__ == "__main__":
    main()
