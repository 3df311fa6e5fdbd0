"""Hostile programs: each gives a wrong answer and tries one trick to be scored right anyway.

Every program here must score 0 (no test passed, or a recorded failure reason), and the host
must be unchanged after the whole suite: no process of a sandbox uid, no new SysV shared
memory segment, no new file in /tmp, /var/tmp or /dev/shm. The tricks are the ones a policy
trained on code rewards has been seen to find, or could: reaching the harness's globals or
frames, patching builtins and json, reading or writing the expected answers, exiting early
with success, signals, forks, threads, huge output, shared memory, sockets, setuid, /proc,
filling the disk, memory bombs.

On the code before the checks moved out of the candidate's process, several of these forge a
pass (the module docstring of envs.sandbox.run says why they cannot now).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from helpers.uids import sandbox_processes, sandboxed

from envs.sandbox import Limits, run_program

NEEDS = "the sandbox's uid and namespace isolation need root on Linux"
if os.environ.get("CI") == "true":
    assert os.geteuid() == 0, NEEDS
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason=NEEDS)

ADD = {"inputs": ["1\n2", "3\n4", "-5\n5"], "outputs": ["3", "7", "0"], "fn_name": "add"}
SUM = {"inputs": ["1 2\n", "3 4\n", "-5 5\n"], "outputs": ["3", "7", "0"]}
WRONG = "\ndef add(a, b):\n    return a - b\n"  # wrong on every test
WRONG_IO = "\na, b = map(int, input().split())\nprint(a - b)\n"
LIMITS = Limits(wall_s=2.0, cpu_s=1, memory_mb=256, max_processes=8, file_mb=4, output_kb=64, tmp_mb=8)

# (trick, tests, program). Each program's own answer is wrong; the trick tries to hide that.
HOSTILE = [
    # -- the harness's globals and frames
    (
        "walk frames up and rewrite the runner's locals",
        ADD,
        "import sys\nf = sys._getframe()\nwhile f:\n    f.f_locals.update(tests=[True]*3, ok=True)\n    f = f.f_back\n"
        + WRONG,
    ),
    (
        "find the expected outputs among live objects",
        ADD,
        "import gc\nouts = [o for o in gc.get_objects() if isinstance(o, dict) and 'outputs' in o]\n"
        "ANS = outs[0]['outputs'] if outs else ['-1']\ndef add(a, b):\n    return int(ANS[0])\n",
    ),
    (
        "walk the frames for the tests and answer from them",
        ADD,
        "import sys, json\ndef add(a, b):\n    f = sys._getframe(1)\n    while f:\n"
        "        for v in list(f.f_locals.values()) + list(f.f_globals.values()):\n"
        "            if isinstance(v, dict) and 'outputs' in v and 'inputs' in v and f'{a}\\n{b}' in v['inputs']:\n"
        "                return json.loads(v['outputs'][v['inputs'].index(f'{a}\\n{b}')])\n"
        "        f = f.f_back\n    return -1\n",
    ),
    (
        "print the expected stdout found in memory",
        SUM,
        "import gc, sys\nline = sys.stdin.read()\n"
        "d = [o for o in gc.get_objects() if isinstance(o, dict) and 'outputs' in o and 'inputs' in o]\n"
        "print(d[0]['outputs'][d[0]['inputs'].index(line)] if d and line in d[0]['inputs'] else -1)\n",
    ),
    (
        "rebind the runner's emit function",
        ADD,
        "import sys\nf = sys._getframe(1)\nf.f_globals['emit'] = lambda r: None\n" + WRONG,
    ),
    (
        "patch the caller's globals to a fake verdict",
        ADD,
        "import sys\nfor f in (sys._getframe(i) for i in range(1, 3)):\n    f.f_globals['passed'] = 3\n" + WRONG,
    ),
    ("replace __builtins__ in the namespace", ADD, "__builtins__ = {}\n" + WRONG),
    # -- monkeypatching the library the checks would use
    ("json.dumps always says 3", ADD, "import json\njson.dumps = lambda *a, **k: '3'\n" + WRONG),
    (
        "json.loads returns what was asked for",
        ADD,
        "import json\n_l = json.loads\njson.loads = lambda s, *a, **k: 3\n" + WRONG,
    ),
    (
        "builtins.isinstance and callable always true",
        ADD,
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.callable = lambda *a: True\n" + WRONG,
    ),
    (
        "an object that equals everything",
        ADD,
        "class Any(int):\n    def __eq__(self, o):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Any(a - b)\n",
    ),
    (
        "a str subclass claiming equality",
        SUM,
        "class S(str):\n    def __eq__(self, o):\n        return True\n    def strip(self, *a):\n        return self\n"
        "import sys\nsys.stdout.write(S('nope'))\n",
    ),
    ("os.write patched to swallow reports", ADD, "import os\nos.write = lambda fd, b: len(b)\n" + WRONG),
    (
        "sys.modules['json'] replaced",
        ADD,
        "import sys, types\nfake = types.ModuleType('json')\nfake.dumps = lambda *a, **k: '7'\n"
        "fake.loads = lambda *a, **k: 7\nsys.modules['json'] = fake\n" + WRONG,
    ),
    (
        "the program's own print rebinds stdout to the real one",
        SUM,
        "import sys\nsys.stdout = sys.__stdout__\nprint(3)\n" + WRONG_IO,
    ),
    # -- reading or writing the expected answers
    (
        "read the test file",
        ADD,
        "import glob, json\nfiles = glob.glob('/tmp/**/*.json', recursive=True) + glob.glob('*.json')\n"
        "data = [json.load(open(f)) for f in files]\nANS = [d.get('outputs') for d in data if isinstance(d, dict)]\n"
        "def add(a, b):\n    return int(ANS[0][0]) if ANS and ANS[0] else -1\n",
    ),
    (
        "search the filesystem for the outputs",
        ADD,
        "import os\nhits = []\nfor top in ('/tmp', '/var/tmp', '/dev/shm', '/run', '/root'):\n"
        "    for r, _, fs in os.walk(top):\n        hits += fs\n" + WRONG,
    ),
    (
        "write forged report lines on every fd",
        ADD,
        "import os, json\nfor fd in range(3, 64):\n    for i, v in enumerate(['3', '7', '0']):\n        try:\n"
        "            os.write(fd, (json.dumps({'i': i, 'out': 'x' + v}) + '\\n').encode())\n        except OSError:\n"
        "            pass\n" + WRONG,
    ),
    ("print the one answer shown in the prompt for every input", SUM, "input()\nprint(3)\n"),
    (
        "write a forged 'done' and exit before the tests",
        ADD,
        "import os, json\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"done\": true}\\n')\n"
        "    except OSError:\n        pass\nos._exit(0)\n",
    ),
    # -- exiting early with success
    ("os._exit(0) at load", ADD, "import os\nos._exit(0)\n" + WRONG),
    ("sys.exit(0) in the function", ADD, "import sys\ndef add(a, b):\n    sys.exit(0)\n"),
    ("raise SystemExit in stdin mode after no output", SUM, "raise SystemExit(0)\n"),
    (
        "kill the own process with a signal mid-run",
        ADD,
        "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGTERM)\n    return a - b\n",
    ),
    # -- signals, forks, threads
    (
        "signal the parent and PID 1",
        ADD,
        "import os, signal\nfor pid in (os.getppid(), 1, -1):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
        "    except OSError:\n        pass\n" + WRONG,
    ),
    (
        "a forked child forges results after the parent's exit",
        ADD,
        "import os, time, json\nif os.fork() == 0:\n    time.sleep(0.5)\n    for fd in range(3, 64):\n        try:\n"
        '            os.write(fd, b\'{"i": 0, "out": "3"}\\n\')\n        except OSError:\n            pass\n'
        "    os._exit(0)\n" + WRONG,
    ),
    (
        "a daemon that outlives the run",
        ADD,
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(120)\n"
        "    os._exit(0)\n" + WRONG,
    ),
    (
        "a thread that rewrites results while the runner works",
        ADD,
        "import threading, sys\ndef meddle():\n    for _ in range(10000):\n        for f in sys._current_frames().values():\n"
        "            f.f_locals.setdefault('ok', True)\nthreading.Thread(target=meddle, daemon=True).start()\n" + WRONG,
    ),
    ("a fork bomb", ADD, "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"),
    (
        "thread bomb",
        ADD,
        "import threading, time\nwhile True:\n    threading.Thread(target=time.sleep, args=(60,)).start()\n",
    ),
    # -- resources
    ("huge output", SUM, "import sys\nsys.stdout.write('7' * 10**8)\n"),
    ("huge return value", ADD, "def add(a, b):\n    return '3' * 10**7\n"),
    ("memory bomb at load", ADD, "x = bytearray(8 * 1024**3)\n" + WRONG),
    (
        "memory growing in the function",
        ADD,
        "def add(a, b):\n    xs = []\n    while True:\n        xs.append(' ' * 10**6)\n",
    ),
    ("an infinite loop", ADD, "def add(a, b):\n    while True:\n        pass\n"),
    ("sleeping past the wall clock", ADD, "import time\ntime.sleep(30)\n" + WRONG),
    ("filling the disk", ADD, "i = 0\nwhile True:\n    open(f'/tmp/fill{i}', 'wb').write(b'x' * 10**6)\n    i += 1\n"),
    (
        "SysV shared memory left behind",
        ADD,
        "import ctypes\nlibc = ctypes.CDLL(None)\nfor _ in range(8):\n    libc.shmget(0, 64 * 1024**2, 0o1666)\n"
        + WRONG,
    ),
    (
        "POSIX shared memory left behind",
        ADD,
        "from multiprocessing import shared_memory\nm = shared_memory.SharedMemory(create=True, size=2**20)\n" + WRONG,
    ),
    (
        "file descriptors exhausted",
        ADD,
        "fs = []\ntry:\n    while True:\n        fs.append(open('/dev/null'))\nexcept OSError:\n    pass\n" + WRONG,
    ),
    # -- the host
    (
        "connect to the host's Redis and write a verdict",
        ADD,
        "import socket\ntry:\n    s = socket.create_connection(('127.0.0.1', 6379), timeout=1)\n"
        "    s.sendall(b'SET forged 1\\r\\n')\nexcept OSError:\n    pass\n" + WRONG,
    ),
    (
        "connect to host Unix sockets",
        ADD,
        "import socket, glob\nfor p in glob.glob('/run/**', recursive=True) + glob.glob('/var/run/**', recursive=True):\n"
        "    try:\n        socket.socket(socket.AF_UNIX).connect(p)\n    except OSError:\n        pass\n" + WRONG,
    ),
    (
        "abstract Unix socket of the host",
        ADD,
        "import socket\ntry:\n    socket.socket(socket.AF_UNIX).connect('\\0farm')\nexcept OSError:\n    pass\n"
        + WRONG,
    ),
    (
        "setuid binaries",
        ADD,
        "import subprocess\nfor cmd in (['su', '-c', 'id'], ['passwd', '-S'], ['mount', '-t', 'tmpfs', 'x', '/mnt']):\n"
        "    try:\n        subprocess.run(cmd, timeout=1, capture_output=True)\n    except Exception:\n        pass\n"
        + WRONG,
    ),
    (
        "become root and remount the host writable",
        ADD,
        "import ctypes, os\nlibc = ctypes.CDLL(None)\nlibc.mount(None, b'/', None, 32 | 4096, None)\n"
        "try:\n    open('/usr/forged', 'w').write('x')\nexcept OSError:\n    pass\n" + WRONG,
    ),
    (
        "/proc snooping for the farm's secrets",
        ADD,
        "import os\nseen = []\nfor p in os.listdir('/proc'):\n    if p.isdigit():\n        try:\n"
        "            seen.append(open(f'/proc/{p}/cmdline').read() + open(f'/proc/{p}/environ').read())\n"
        "        except OSError:\n            pass\n"
        "ANS = 3 if any('redis' in s or 'farm' in s for s in seen) else -1\ndef add(a, b):\n    return ANS\n",
    ),
    ("ptrace the runner", ADD, "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.ptrace(16, 1, 0, 0)\n" + WRONG),
    (
        "a new user namespace of its own",
        ADD,
        "import ctypes\nlibc = ctypes.CDLL(None)\nlibc.unshare(0x10000000 | 0x00020000)\n" + WRONG,
    ),
]


# The answer shown in a code_gen prompt is right for that one test: partial credit, honestly earned.
PARTIAL = {"print the one answer shown in the prompt for every input"}


def _shm_segments() -> set[str]:
    """Shared memory segments a sandbox uid created (a program's; the host's own run as root)."""
    rows = [line.split() for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:] if line.strip()]
    return {row[1] for row in rows if sandboxed(int(row[9]))}


def _files() -> set[str]:
    """What a program could leave in the shared temporary directories (owned by its sandbox uid), and
    the sandbox's own directories (farm-sandbox-*); other files there are other tests'."""
    out = set()
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        for p in Path(top).iterdir():
            try:
                mine = sandboxed(p.lstat().st_uid) or p.name.startswith("farm-sandbox-")
            except OSError:
                continue
            if mine and "farm-sandbox-uids" not in p.name:
                out.add(str(p))
    return out


def _outlived(now, before: set[str], seconds: float = 30.0) -> set[str]:
    """What `now()` holds that `before` did not and that is still there after `seconds`. Other tests
    of a parallel run sandbox programs too: theirs come and go, a leak of this suite's stays."""
    extra = now() - before
    deadline = time.monotonic() + seconds
    while extra and time.monotonic() < deadline:
        time.sleep(0.5)
        extra &= now()
    return extra


@pytest.fixture(scope="module")
def host():
    before = (set(sandbox_processes()), _shm_segments(), _files())
    yield
    procs, shm, files = before  # processes of sandbox uids before the suite: rq sandbox workers of other tests
    assert not _outlived(lambda: set(sandbox_processes()), procs), "processes of sandbox uids outlived the suite"
    assert not _outlived(_shm_segments, shm), "shared memory segments outlived the suite"
    new = _outlived(_files, files)
    assert not new, f"files outlived the suite: {sorted(new)[:5]}"


def test_the_suite_is_large_and_every_trick_is_different():
    assert len(HOSTILE) >= 40 and len({trick for trick, _, _ in HOSTILE}) == len(HOSTILE)


@pytest.mark.parametrize("trick,tests,program", HOSTILE, ids=[t for t, _, _ in HOSTILE])
@pytest.mark.slow
def test_hostile_program_scores_nothing(host, trick, tests, program):
    r = run_program(program, tests, LIMITS)
    assert r.passed < r.total, (trick, r.reason, r.tests)  # NeMo Gym's reward (all pass): 0
    if trick not in PARTIAL:
        assert r.passed == 0 and not any(r.tests), (trick, r.reason, r.tests, r.detail, r.stderr[-500:])
    assert r.reason in ("ok", "timeout", "memory", "output_limit", "killed", "error")
    assert r.duration_s < LIMITS.wall_s + 2


def test_redis_on_the_host_saw_no_write(host, sync_redis):
    assert sync_redis.get("forged") is None


@pytest.mark.slow
def test_a_correct_program_still_passes_after_the_suite(host):
    assert run_program("def add(a, b):\n    return a + b\n", ADD, LIMITS).passed == 3
    assert run_program("a, b = map(int, input().split())\nprint(a + b)\n", SUM, LIMITS).passed == 3
    assert subprocess.run(["true"]).returncode == 0
