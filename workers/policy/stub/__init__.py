"""A stand-in OpenAI-compatible policy server for the tests and the benchmarks.

Shipped with the policy clients it stands in for, as httpx ships MockTransport, so that tests
and bench/ use one stub and neither imports the other. It is a real HTTP server in a process
of its own: what it fakes is the model (scripted replies after a set latency, faults on
demand), never the transport the clients under test use.

- `server`: the server itself (`python -m workers.policy.stub`): HTTP, aborts, the command line;
- `model`: `Script`, what it answers, and `Options`, when and how (latency distribution, random
  replies, faults), as the command line and POST /control set them;
- `process`: `StubProcess`, the server in a child process, restartable on one port;
- `weather`: the `single_tool_call` scenario (a tool call for the weather in Paris, then an
  answer) as a Script and rows that earn reward 1.
"""

from workers.policy.stub.model import Script
from workers.policy.stub.process import StubProcess
from workers.policy.stub.weather import WEATHER_ANSWER, WEATHER_CALL, weather_rows, weather_script

__all__ = ["WEATHER_ANSWER", "WEATHER_CALL", "Script", "StubProcess", "weather_rows", "weather_script"]
