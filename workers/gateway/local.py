"""The gateway in process: an httpx client whose requests the gateway's handler answers directly.

An in-process harness (workers/loops/harness.py) gets an openai client over this transport: no
socket and no HTTP parsing, the same answers as the gateway's server gives over HTTP.
"""

from __future__ import annotations

from typing import Any

from workers.gateway.server import Gateway

__all__ = ["local_http"]


def local_http(gateway: Gateway) -> Any:
    """The http client of every in-process harness's openai client: an httpx transport that hands each
    request to `gateway.handle` in the worker's event loop (no socket, no HTTP parsing; the same
    answers as the server). A harness that closes its client closes nothing shared."""
    import httpx2

    class Local(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            answer = await gateway.handle(
                request.method, request.url.path, request.headers.get("authorization", ""), await request.aread()
            )
            return httpx2.Response(answer.status, headers=answer.headers, content=answer.body, request=request)

    class Shared(httpx2.AsyncClient):
        async def aclose(self) -> None:  # a harness's `async with client` must not close the others'
            return None

    return Shared(transport=Local(), timeout=httpx2.Timeout(None))
