"""Token traces on the wire: ids and logprobs packed as little-endian int32 / float32 bytes.

A rollout's token ids travel as packed int32 bytes and its logprobs as float32 bytes, so an
8K-token rollout is three memcpy-sized blobs rather than 16K msgpack numbers. farm.schema
re-exports everything here.
"""

from __future__ import annotations

import sys
from array import array
from typing import Iterable

import msgspec

__all__ = ["TokenTrace", "pack_f32", "pack_i32", "unpack_f32", "unpack_i32"]

_LITTLE = sys.byteorder == "little"


def pack_i32(values: Iterable[int]) -> bytes:
    a = array("i", values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def pack_f32(values: Iterable[float]) -> bytes:
    a = array("f", values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def _unpack(typecode: str, data: bytes) -> array:
    """Little-endian bytes (as packed) as an array of `typecode`, on any host."""
    a = array(typecode)
    a.frombytes(data)
    if not _LITTLE:
        a.byteswap()
    return a


def unpack_i32(data: bytes) -> array:
    return _unpack("i", data)


def unpack_f32(data: bytes) -> array:
    return _unpack("f", data)


class TokenTrace(msgspec.Struct, forbid_unknown_fields=True):
    """Token-exact trace of one rollout.

    `completion_ids` holds everything after the first prompt: sampled tokens (env_mask 1)
    and tokens the environment inserted between turns (env_mask 0). `logprobs` has one
    value per completion token (0.0 where the environment inserted it). `turns` lists the
    [start, end) offsets of each sampled span within completion_ids.
    """

    prompt_ids: bytes = b""
    completion_ids: bytes = b""
    logprobs: bytes = b""
    env_mask: bytes = b""
    turns: list[tuple[int, int]] = []
    # The policy version that produced each completion token (int32, as packed; the version current
    # when an inserted token was added): a rollout resumed after weight updates mixes versions, and the
    # trainer corrects (and may mask) per token. Empty: every token is the rollout's policy_version.
    versions: bytes = b""

    def __post_init__(self) -> None:
        if len(self.prompt_ids) % 4 or len(self.completion_ids) % 4 or len(self.logprobs) % 4:
            raise ValueError("packed token arrays must be a whole number of 4-byte values")
        n = len(self.completion_ids) // 4
        if len(self.logprobs) // 4 != n:
            raise ValueError(f"{len(self.logprobs) // 4} logprobs for {n} completion tokens")
        if len(self.env_mask) != n:
            raise ValueError(f"env_mask has {len(self.env_mask)} entries for {n} completion tokens")
        if self.versions and len(self.versions) != 4 * n:
            raise ValueError(f"versions has {len(self.versions) // 4} entries for {n} completion tokens")

    @classmethod
    def build(
        cls,
        prompt_ids: Iterable[int],
        completion_ids: Iterable[int],
        logprobs: Iterable[float],
        env_mask: Iterable[int],
        turns: list[tuple[int, int]] | None = None,
    ) -> "TokenTrace":
        return cls(pack_i32(prompt_ids), pack_i32(completion_ids), pack_f32(logprobs), bytes(env_mask), turns or [])

    def prompt(self) -> array:
        return unpack_i32(self.prompt_ids)

    def completion(self) -> array:
        return unpack_i32(self.completion_ids)

    def completion_logprobs(self) -> array:
        return unpack_f32(self.logprobs)

    def mask(self) -> list[int]:
        return list(self.env_mask)

    def token_versions(self, default: int) -> array:
        """The policy version of each completion token (`default` for all when none were recorded)."""
        if self.versions:
            return unpack_i32(self.versions)
        return array("i", [default]) * (len(self.completion_ids) // 4)
