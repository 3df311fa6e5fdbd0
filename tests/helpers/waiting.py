"""Polling a condition with a deadline: the one way the tests wait for another process or task."""

from __future__ import annotations

import asyncio
import time


def wait_for(pred, timeout: float = 20.0, every: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def async_wait_for(pred, timeout: float = 20.0, every: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        await asyncio.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
