"""nemo_gym_server: a NeMo Gym resource server, unchanged, as an environment.

A team that already has a NeMo Gym resource server (a `SimpleResourcesServer`, or anything that
speaks its HTTP protocol) points an agent at its URL instead of rewriting it. Per rollout:

    POST /seed_session  the row                    once, before the rollout's first tool call or verify
    POST /<tool>        the call's arguments       the answer's body is the tool's result, as NeMo Gym's
                                                   own agents hand it to the model
    POST /verify        the row + `response`       the rollout's output items as a Responses API object;
                                                   the answer's `reward` is the reward

NeMo Gym ties the calls of one rollout together with a session cookie, so each rollout keeps a
cookie dict of its own and sends it explicitly; the process shares one aiohttp client (one
connection pool, no cookie jar), opened in `setup()` and closed in `aclose()`.

Options (`env_options` of an agent): `url`; `tools`, the tools the server serves, each a name or
a JSON schema (Responses or chat shape; NeMo Gym rows carry the schemas in
`responses_create_params.tools`, so names are enough for them, and a row that offers a tool not
listed here is `malformed`); `timeout_s` (each request), `connect_timeout_s`, `max_connections`.

Errors: the server's answer to a tool call, whatever its status, goes back to the model (a 422,
FastAPI's refusal of the arguments, as bad arguments); everything else fails the rollout with a
one-line reason naming the URL and the route: no answer (unreachable, timed out; retryable, as are
429/502/503/504), another non-2xx status, a non-JSON answer, an answer without a numeric `reward`.
A tool call that got no answer fails the rollout at verify too: its reward would say nothing.
The answer's other numbers (those it did not echo from the request) become metrics, and its
`reward_components` (NeMo Gym's multi-reward answers) the reward's components.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import aiohttp

from envs.sdk import (
    AgentSettings,
    Environment,
    ErrorKind,
    RolloutFailure,
    Row,
    RowError,
    Tool,
    ToolArgumentError,
    Transcript,
    Verdict,
    parse_row,
)

# Routes of the protocol itself, never a tool; and what a tool's name must look like in a URL.
RESERVED = frozenset({"seed_session", "verify", "aggregate_metrics", "close_resources_session", "mcp"})
_TOOL_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_HERMES_CALL = re.compile(r"<tool_call>.*?</tool_call>", re.S)
RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


class ServerRow(Row):
    """Any NeMo Gym row: the server, not a Row type, knows its ground truth."""


@dataclass(frozen=True)
class CheckedRow:
    """A row that fits ServerRow, kept whole: seed_session and verify get every field it has."""

    fields: dict
    tools: Optional[list[dict]]  # the row's `responses_create_params.tools`


@dataclass
class Session:
    """One rollout's session with the server (its state): the row it seeds with, its cookies, and the
    failure that ended it, if one did."""

    row: CheckedRow
    cookies: dict[str, str] = field(default_factory=dict)
    seeded: bool = False
    failure: Optional[RolloutFailure] = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ToolHTTPError(Exception):
    """A tool's route answered with an error status; its body goes back to the model."""


def one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def tool_of(spec: Union[str, dict], forward: Any) -> Tool:
    """A Tool from a name or a JSON schema (Responses or chat shape) whose body forwards to the server."""
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"a tool must be a name or a JSON schema object, got {type(spec).__name__}")
    body = spec.get("function", spec)
    name = body.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name) or name in RESERVED:
        raise ValueError(f"bad tool name {name!r}: letters, digits, _ . - only, and not one of {sorted(RESERVED)}")
    parameters = body.get("parameters") or {"type": "object", "properties": {}}
    return Tool(name=name, description=body.get("description") or "", parameters=parameters, fn=forward(name))


def response_tool(schema: dict) -> dict:
    """A tool as a Responses API `tools` entry (FunctionTool), from either shape."""
    body = schema.get("function", schema)
    return {"type": "function", "strict": None, **{k: v for k, v in body.items() if k != "type"}}


def output_items(output: list[dict]) -> list[dict]:
    """The transcript's items as a Responses API `output`, the shape a NeMo Gym agent sends to verify:
    ids and statuses filled in, and Hermes `<tool_call>` markup taken out of assistant text (a model
    server with a tool parser returns those calls as `function_call` items only)."""
    items = []
    for i, item in enumerate(output):
        kind = item.get("type")
        if kind == "message" and item.get("role") == "assistant":
            parts = [dict(p) for p in item.get("content", [])]
            for part in parts:
                if part.get("type") == "output_text":
                    part["text"] = _HERMES_CALL.sub("", part.get("text", "")).strip()
                    part.setdefault("annotations", [])
            parts = [p for p in parts if p.get("type") != "output_text" or p["text"]]
            if parts:
                items.append({"id": f"msg_{i}", "status": "completed", **item, "content": parts})
        elif kind == "function_call":
            items.append({"id": f"fc_{i}", "status": "completed", **item})
        else:
            items.append(dict(item))
    return items


def response_object(params: dict, tools: list[dict], transcript: Transcript) -> dict:
    """The rollout as the Responses API object (`response`) that /verify reads."""
    truncated = transcript.truncated
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": time.time(),
        "model": params.get("model") or "policy",
        "status": "incomplete" if truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
        "output": output_items(transcript.output),
        "parallel_tool_calls": params.get("parallel_tool_calls", True),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": [response_tool(t) for t in tools],
    }


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class NemoGymServer(Environment):
    name = "nemo_gym_server"
    verifier_version = "1"
    row_type = ServerRow

    def __init__(
        self,
        url: str,
        tools: Optional[list[Union[str, dict]]] = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 64,
    ):
        """`url`: the resource server's base URL; `tools`: the tools it serves (names or schemas);
        `timeout_s`: each request's limit, counted from when it holds one of the `max_connections`
        connections (waiting for one is not the server's delay); the loop's tool and verify limits
        sit above it, so the request's own, clearer, reason is the one recorded."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"url must be an http(s) URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s, connect=connect_timeout_s)
        self.timeout_s, self.max_connections = timeout_s, max_connections
        built = [tool_of(spec, self._forwarder) for spec in tools or []]
        self._tools = {t.name: t for t in built}
        if len(self._tools) != len(built):
            raise ValueError(f"a tool is listed twice in {[t.name for t in built]}")
        limit = timeout_s * 2 + 5  # a tool call or a verify may seed the session first: two requests
        self.agent = AgentSettings(loop="tool_use", tool_timeout_s=limit, verify_timeout_s=limit)
        self._http: Optional[aiohttp.ClientSession] = None
        self._slots: Optional[asyncio.Semaphore] = None  # one per connection: the queue outside the clock

    # --- the shared client ---

    async def setup(self) -> None:
        self._client()

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:  # opened by setup(), or on first use (offline scoring, tests)
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections),
                cookie_jar=aiohttp.DummyCookieJar(),  # cookies are per rollout (Session), never shared
                timeout=self.timeout,
            )
            self._slots = asyncio.Semaphore(self.max_connections)
        return self._http

    def _fail(self, kind: ErrorKind, route: str, reason: str, retryable: bool = False) -> RolloutFailure:
        message = f"nemo_gym_server {self.url}: POST {route}: {one_line(reason)}"
        return RolloutFailure(kind, message, retryable=retryable)

    async def _post(self, session: Session, route: str, body: Any, kind: ErrorKind) -> tuple[int, str]:
        """(status, body text) of one request in the rollout's session; RolloutFailure when no answer came."""
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in session.cookies.items())} if session.cookies else {}
        client = self._client()
        assert self._slots is not None
        try:
            async with self._slots:  # the request's clock (the client's timeout) starts with its connection
                async with client.post(self.url + route, json=body, headers=headers) as resp:
                    text = (await resp.read()).decode("utf-8", "replace")
                    session.cookies.update({name: morsel.coded_value for name, morsel in resp.cookies.items()})
                    return resp.status, text
        except asyncio.TimeoutError:
            raise self._fail(kind, route, f"no answer within {self.timeout_s:g}s", retryable=True) from None
        except aiohttp.ClientError as exc:
            raise self._fail(kind, route, f"no answer ({type(exc).__name__}: {exc})", retryable=True) from None

    def _refused(self, kind: ErrorKind, route: str, status: int, text: str) -> RolloutFailure:
        return self._fail(kind, route, f"answered HTTP {status}: {text}", retryable=status in RETRYABLE_STATUS)

    # --- rows and sessions ---

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def check_row(self, row: dict) -> CheckedRow:
        typed = parse_row(row, ServerRow)
        offered = typed.responses_create_params.tools
        names = [(t.get("function", t) or {}).get("name") for t in offered or []]
        missing = [n for n in names if n not in self._tools]
        if missing:
            raise RowError(
                f"row offers tool(s) {missing} that the server's `tools` option does not list "
                f"({', '.join(self._tools) or 'none'}); add them to the agent's env_options"
            )
        return CheckedRow(fields=dict(row), tools=offered)

    def new_state(self, row: CheckedRow) -> Session:
        return Session(row)

    async def _seed(self, session: Session) -> None:
        async with session.lock:
            if session.failure is not None:
                raise session.failure
            if session.seeded:
                return
            try:
                status, text = await self._post(session, "/seed_session", session.row.fields, ErrorKind.verifier)
                if not 200 <= status < 300:
                    raise self._refused(ErrorKind.verifier, "/seed_session", status, text)
            except RolloutFailure as exc:
                session.failure = exc
                raise
            session.seeded = True

    # --- tools ---

    def _forwarder(self, name: str) -> Any:
        async def forward(session: Session, /, **arguments: Any) -> str:
            return await self.call_tool(session, name, arguments)

        return forward

    async def call_tool(self, session: Session, name: str, arguments: dict) -> str:
        """The server's answer to one tool call, as text; a failure to get one is kept for verify."""
        await self._seed(session)
        try:
            status, text = await self._post(session, f"/{name}", arguments, ErrorKind.tool)
        except RolloutFailure as exc:
            session.failure = session.failure or exc
            raise
        if status == 422:
            raise ToolArgumentError(f"the server refused the arguments: {one_line(text, 1000)}")
        if not 200 <= status < 300:
            raise ToolHTTPError(f"HTTP {status}: {one_line(text, 1000)}")
        return text

    # --- verifier ---

    async def verify(self, row: CheckedRow, session: Session, transcript: Transcript) -> Verdict:
        """The server's verdict on the rollout; RolloutFailure (one line) when it gave none."""
        await self._seed(session)
        params = row.fields["responses_create_params"]
        offered = row.tools if row.tools else [t.response_schema() for t in self._tools.values()]
        body = {**row.fields, "response": response_object(params, offered, transcript)}
        status, text = await self._post(session, "/verify", body, ErrorKind.verifier)
        if not 200 <= status < 300:
            raise self._refused(ErrorKind.verifier, "/verify", status, text)
        try:
            answer = json.loads(text)
        except ValueError:
            raise self._fail(ErrorKind.verifier, "/verify", f"answered non-JSON: {text}") from None
        problem = _not_a_verdict(answer)
        if problem:
            raise self._fail(ErrorKind.verifier, "/verify", problem)
        return verdict_of(answer, sent=body)


def _not_a_verdict(answer: Any) -> Optional[str]:
    if not isinstance(answer, dict):
        return f"answered JSON that is not an object: {json.dumps(answer)}"
    if "reward" not in answer:
        return f"answered without `reward` (keys: {', '.join(answer) or 'none'})"
    if not _number(answer["reward"]):
        return f"answered a `reward` that is not a number: {answer['reward']!r}"
    return None


def verdict_of(answer: dict, sent: dict) -> Verdict:
    """`reward`; `reward_components` as components; as metrics, the answer's other numbers and
    booleans, less those it echoed from the request (NeMo Gym's answers repeat the request's fields)."""
    components = answer.get("reward_components")
    metrics = {
        k: v
        for k, v in answer.items()
        if k not in ("reward", "reward_components") and k not in sent and (isinstance(v, bool) or _number(v))
    }
    return Verdict(
        reward=float(answer["reward"]),
        components={k: float(v) for k, v in components.items() if _number(v)} if isinstance(components, dict) else {},
        metrics=metrics,
    )
