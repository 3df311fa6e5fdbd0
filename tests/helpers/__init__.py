"""What the tests share besides fixtures (those stay in tests/conftest.py), one module per concern.

`redis` (test settings and namespaces, driving the settle scripts by hand), `processes` (starting,
finding and stopping processes; system binaries), `workers` (a worker as a process or in this
event loop, rows through one), `policies` (stand-ins for the model: the scripted policy, the
policy stub), `data` (rows), `trainer` (the trainer's small model and config), `browser`
(Playwright pages), `waiting` (polling a condition), and `markers`, the check that a test which
starts a process or a server is marked `slow`.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
