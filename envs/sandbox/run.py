"""One sandbox run: the candidate program against a row's unit tests, judged in this process.

Tests (NeMo Gym code_gen / LiveCodeBench shape, `verifier_metadata.unit_tests`):
  {"inputs": [...], "outputs": [...]}              stdin/stdout: each input is fed to the
                                                   program; its stdout must match (stripped);
  {"inputs": [...], "outputs": [...], "fn_name": f} call-based: each input holds the JSON
                                                   arguments, one per line; f(*args) must equal
                                                   the JSON output after a JSON round trip.
Only the program and the inputs go into the sandbox (envs.sandbox.runner); the outputs come
back as text, and the comparison with the expected outputs happens here, so a program can
make its own outputs say anything but can never see, reach or rewrite the checks.

Reasons: ok (the runner reached every test; some may have failed), timeout (wall or CPU
limit), memory, output_limit (a test's output, or all of them, past the limit), killed (any
other signal, e.g. the file-size limit), error (the program did not load, or the runner
died before the end). Every reason but ok scores no test. A failure of the
machinery itself raises SandboxError: the verifier's failure, never the candidate's 0.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from envs.sandbox import cgroups, isolation
from envs.sandbox.result import Limits, SandboxError, SandboxResult, SandboxUnavailable

RUNNER = Path(__file__).with_name("runner.py")
TAIL = 2000  # characters of stdout/stderr kept on the result


def _reachable_by_others(path: str | Path) -> bool:
    p = Path(path).resolve()
    return all(part.stat().st_mode & stat.S_IXOTH for part in [p, *p.parents])


def interpreter() -> str:
    """A Python the sandbox uid can execute (the farm's own may live under root's home)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")):
        if candidate and os.path.exists(candidate) and _reachable_by_others(candidate):
            return candidate
    raise SandboxUnavailable("no Python interpreter that an unprivileged uid can execute")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _tail(path: Path) -> str:
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, 2) - TAIL))
        return f.read().decode("utf-8", "replace")


def check_tests(unit_tests: Any) -> tuple[list[str], list[str], Optional[str]]:
    inputs, outputs = (unit_tests or {}).get("inputs"), (unit_tests or {}).get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs) or not inputs:
        raise SandboxError("unit_tests needs non-empty `inputs` and `outputs` lists of the same length")
    if not all(isinstance(x, str) for x in inputs + outputs):
        raise SandboxError("unit_tests `inputs` and `outputs` must hold strings")
    fn_name = unit_tests.get("fn_name")
    if fn_name is not None and not isinstance(fn_name, str):
        raise SandboxError("unit_tests `fn_name` must be a string")
    return inputs, outputs, fn_name


def run_program(program: str, unit_tests: dict, limits: Limits = Limits()) -> SandboxResult:
    """Run `program` on the inputs of `unit_tests` in the sandbox and judge its outputs here."""
    inputs, outputs, fn_name = check_tests(unit_tests)
    root = os.geteuid() == 0
    namespaces = isolation.can_unshare()
    if not namespaces and not limits.allow_network:
        raise SandboxUnavailable(
            "no user, network and mount namespaces can be made here (unprivileged user "
            "namespaces are off, or seccomp forbids unshare); allow them for the sandbox "
            "worker, or set allow_network to run with only the uid and rlimits"
        )
    python = interpreter()
    if root:
        isolation.libc().prctl(isolation.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        with isolation.UidLease() as uid:
            try:
                return _run(
                    program, inputs, outputs, fn_name, limits, python, uid, namespaces, limits.max_processes + 2
                )
            finally:
                isolation.kill_uid(uid)
    nproc = isolation.uid_tasks(os.getuid()) + limits.max_processes + 2
    return _run(program, inputs, outputs, fn_name, limits, python, None, namespaces, nproc)


def _run(
    program: str,
    inputs: list[str],
    outputs: list[str],
    fn_name: Optional[str],
    limits: Limits,
    python: str,
    uid: Optional[int],
    namespaces: bool,
    nproc: int,
) -> SandboxResult:
    scratch = Path(tempfile.mkdtemp(prefix="farm-sandbox-"))  # ours: outputs, never visible to the child
    workdir = Path(tempfile.mkdtemp(prefix="farm-sandbox-run-"))  # the child's, the only place it may write
    cgroup = cgroups.RunCgroup(limits, nproc)
    isolation_record = {
        "uid": uid is not None or os.geteuid() != 0,
        "namespaces": namespaces,
        "network": namespaces,
        "filesystem": namespaces,
        "pid": namespaces,
        "cgroup": bool(cgroup.dirs),
        "no_new_privs": True,
        "no_unix_sockets": namespaces and os.uname().machine in isolation._AUDIT_ARCH,
    }
    try:
        (workdir / "runner.py").write_bytes(RUNNER.read_bytes())
        (workdir / "job.json").write_text(json.dumps({"program": program, "inputs": inputs, "fn_name": fn_name}))
        owner = uid if uid is not None else os.getuid()
        for p in (workdir, workdir / "runner.py", workdir / "job.json"):
            os.chown(p, owner, owner)
        os.chmod(workdir, 0o700)
        limit = limits.output_kb * 1024
        report = os.open(scratch / "report", os.O_CREAT | os.O_WRONLY | os.O_APPEND, 0o600)
        out, err = open(scratch / "stdout", "wb"), open(scratch / "stderr", "wb")
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": isolation.RUN_DIR if namespaces else str(workdir),
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
        }
        started = time.monotonic()
        cpu_before = _children_cpu()
        try:
            proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "runner.py", str(report), str(limit)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=env,
                pass_fds=(report,),
                close_fds=True,
                start_new_session=True,
                preexec_fn=isolation.preexec(
                    str(workdir), limits, uid=uid, nproc=nproc, namespaces=namespaces, cgroup_procs=cgroup.procs
                ),
            )
        except (subprocess.SubprocessError, OSError) as exc:
            raise SandboxError(f"could not set up the sandbox: {exc}") from None
        finally:
            os.close(report)
            out.close()
            err.close()
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        duration = time.monotonic() - started
        cpu = _children_cpu() - cpu_before
        size = (scratch / "report").stat().st_size
        # Every test may report up to the limit, plus room for the records themselves.
        over = size > len(inputs) * (limit + 256) + 4096
        text = "" if over else (scratch / "report").read_text(errors="replace")
        return judge(
            proc.returncode,
            timed_out,
            over,
            text,
            outputs,
            fn_name,
            _tail(scratch / "stdout"),
            _tail(scratch / "stderr"),
            duration,
            cpu,
            isolation_record,
            limits,
        )
    finally:
        cgroup.remove()
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)


def _equal(produced: str, expected: str, fn_name: Optional[str]) -> bool:
    if not fn_name:
        return produced.strip() == expected.strip()
    try:
        return json.loads(produced) == json.loads(expected)
    except ValueError:
        return False


def judge(
    code: Optional[int],
    timed_out: bool,
    over: bool,
    report: str,
    outputs: list[str],
    fn_name: Optional[str],
    stdout: str,
    stderr: str,
    duration: float,
    cpu: float,
    isolation_record: dict,
    limits: Limits,
) -> SandboxResult:
    """The verdict, from what the runner reported and the expected outputs (which it never saw)."""
    total = len(outputs)
    tests = [False] * total
    seen: set[int] = set()
    memory = output_limit = done = False
    load_error = ""
    for line in report.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("done") is True:
            done = True
        elif isinstance(record.get("load"), str):
            memory |= record["load"] == "memory"
            load_error = load_error or record["load"][:200]
        elif type(record.get("i")) is int and 0 <= record["i"] < total and record["i"] not in seen:
            i = record["i"]
            seen.add(i)  # the first report of a test counts; a program writing more changes nothing
            error = record.get("error")
            memory |= error == "memory"
            output_limit |= error == "output_limit"
            produced = record.get("out")
            tests[i] = error is None and isinstance(produced, str) and _equal(produced, outputs[i], fn_name)
    sig = signal.Signals(-code).name if code is not None and code < 0 and -code in signal.valid_signals() else None
    if timed_out:
        reason, detail = "timeout", f"ran past the {limits.wall_s}s wall-clock limit"
    elif sig == "SIGXCPU" or (sig == "SIGKILL" and cpu >= limits.cpu_s):
        reason, detail = "timeout", f"ran past the {limits.cpu_s}s CPU limit"
    elif over or output_limit:
        reason, detail = "output_limit", f"wrote more than {limits.output_kb} KB of output"
    elif memory or "MemoryError" in stderr:
        reason, detail = "memory", f"out of memory ({limits.memory_mb} MB)"
    elif sig:
        reason, detail = "killed", f"killed by {sig}" + (" (file size limit)" if sig == "SIGXFSZ" else "")
    elif done and code == 0:
        reason, detail = "ok", ""
    else:
        reason = "error"
        detail = (
            f"program did not load: {load_error}" if load_error else f"runner exited with status {code} before the end"
        )
    passed = sum(tests) if reason == "ok" else 0
    return SandboxResult(
        reason=reason,
        passed=passed,
        total=total,
        tests=tests if reason == "ok" else [False] * total,
        stdout=stdout,
        stderr=stderr,
        exit_code=code,
        signal=sig,
        detail=detail,
        duration_s=round(duration, 3),
        cpu_s=round(cpu, 3),
        isolation=isolation_record,
    )
