"""What a sandbox run is asked (Limits) and what it answers (SandboxResult), and its two errors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Optional

# ok: the runner reached every test (some may have failed); the others end the run early and
# score it 0 with that reason. A failure of the machinery is SandboxError instead.
Reason = Literal["ok", "timeout", "memory", "output_limit", "killed", "error"]


class SandboxError(Exception):
    """The sandbox machinery failed (not the program): a `sandbox_error` failure, never a 0."""


class SandboxUnavailable(SandboxError):
    """A required isolation layer cannot be set up on this machine."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 5
    memory_mb: int = 512  # address space per process (and the run's cgroup memory, where there is one)
    file_mb: int = 8  # largest file the program may write
    output_kb: int = 1024  # largest output one test may produce (stdout, or a return value's JSON)
    tmp_mb: int = 16  # the private /tmp and /dev/shm, each
    max_processes: int = 8  # processes and threads of the run
    allow_network: bool = False  # run without a network namespace where none can be made


@dataclass
class SandboxResult:
    reason: Reason
    passed: int
    total: int
    tests: list[bool]  # one per unit test; tests never reached count as failed
    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    signal: Optional[str] = None
    detail: str = ""
    duration_s: float = 0.0
    cpu_s: float = 0.0
    isolation: dict[str, Any] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "SandboxResult":
        return cls(**data)
