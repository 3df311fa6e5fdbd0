"""Core of the rollout farm: wire schema, keys, settings, transport, client, CLI."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rollout-farm")  # the installed distribution's, as `farm --version` and heartbeats say
except PackageNotFoundError:
    __version__ = "unknown"
