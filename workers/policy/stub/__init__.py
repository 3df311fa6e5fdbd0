"""A stand-in OpenAI-compatible policy server for the tests and the benchmarks.

Shipped with the policy clients it stands in for, as httpx ships MockTransport, so that tests
and bench/ use one stub and neither imports the other. It is a real HTTP server in a process
of its own: what it fakes is the model (scripted replies after a set latency, faults on
demand), never the transport the clients under test use.

- `server`: the server itself (`python -m workers.policy.stub`): HTTP, aborts, the command line;
- `model`: `Script`, what it answers, and `Options`, when and how (latency distribution, random
  replies, faults, prefill), as the command line and POST /control set them;
- `prefix`: `PrefixCache`, a replica's prefix cache as vLLM's automatic prefix caching keeps it,
  which decides how many prompt tokens a completion is charged prefill time for;
- `generate`: a request answered token by token, streamed in vLLM's event shape or whole, and
  the tokens an aborted one had generated;
- `engine`: the engine mode, continuous batching with a KV capacity and recompute preemption,
  whose gauges /metrics reports by vLLM's names;
- `process`: `StubProcess`, the server in a child process, restartable on one port;
- `weather`: the `single_tool_call` scenario (a tool call for the weather in Paris, then an
  answer) as a Script and rows that earn reward 1.
"""

from workers.policy.stub.model import Script
from workers.policy.stub.prefix import BLOCK, PrefixCache
from workers.policy.stub.process import StubProcess
from workers.policy.stub.weather import WEATHER_ANSWER, WEATHER_CALL, weather_rows, weather_script

__all__ = [
    "BLOCK",
    "WEATHER_ANSWER",
    "WEATHER_CALL",
    "PrefixCache",
    "Script",
    "StubProcess",
    "weather_rows",
    "weather_script",
]
