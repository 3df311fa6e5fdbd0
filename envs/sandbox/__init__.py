"""Run untrusted Python programs against hidden unit tests: code_gen's verifier.

A rollout farm runs thousands of model-written programs, and the model being trained writes
them: a program that finds a way to score wrongly will be learned. So the sandbox assumes
every program is hostile:

  run.py        run_program(program, unit_tests, limits): the program runs alone, sees only the
                test inputs, and returns its outputs; the comparison with the expected outputs
                happens in the caller's process (envs.sandbox.runner is what runs inside).
  isolation.py  the confinement: its own uid, user/mount/PID/network/IPC/UTS namespaces, a
                read-only host with private tmpfs, no_new_privs, cgroup and rlimits.
  jobs.py       the same call as an rq job (JSON, never pickle) on a worker that runs nothing
                else, as an unprivileged uid, on a Redis of its own by default.

What is and is not isolated is recorded on every result (`SandboxResult.isolation`) and
described in docs/environments.md.
"""

from envs.sandbox.isolation import UID_BASE, UID_COUNT
from envs.sandbox.jobs import JOB, QUEUE, SandboxClient, run_job, serve, start_worker
from envs.sandbox.result import Limits, SandboxError, SandboxResult, SandboxUnavailable
from envs.sandbox.run import run_program

__all__ = [
    "JOB",
    "QUEUE",
    "UID_BASE",
    "UID_COUNT",
    "Limits",
    "SandboxClient",
    "SandboxError",
    "SandboxResult",
    "SandboxUnavailable",
    "run_job",
    "run_program",
    "serve",
    "start_worker",
]
