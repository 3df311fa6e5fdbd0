"""The root of the command tree: global options, the Globals they make, typed option values."""

from __future__ import annotations

import logging
import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import click

import farm
from farm.errors import ConfigError
from farm.logs import setup_logging
from farm.settings import Settings, load_settings

log = logging.getLogger("farm.cli")

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class Finite(click.ParamType):
    """A finite float (nan and inf refused), optionally bounded."""

    name = "number"

    def __init__(self, min: Optional[float] = None, min_open: bool = False, max: Optional[float] = None):
        self.min, self.min_open, self.max = min, min_open, max

    def convert(self, value: Any, param, ctx) -> float:
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        if self.min is not None and (x < self.min or (self.min_open and x == self.min)):
            self.fail(f"{value!r} must be {'>' if self.min_open else '>='} {self.min:g}", param, ctx)
        if self.max is not None and x > self.max:
            self.fail(f"{value!r} must be <= {self.max:g}", param, ctx)
        return x


POSITIVE = Finite(0, min_open=True)
COUNT = click.IntRange(min=1)
PORT = click.IntRange(1, 65535)


@dataclass
class Globals:
    config: Optional[str] = None
    overrides: dict[str, Any] = field(default_factory=dict)
    debug: bool = False

    def settings(self, **extra: Any) -> Settings:
        return load_settings(
            self.config, overrides={**self.overrides, **{k: v for k, v in extra.items() if v is not None}}
        )


pass_globals = click.make_pass_decorator(Globals)


@click.group(
    context_settings=CONTEXT,
    epilog="Examples:\n\n  farm demo --noop\n\n"
    "  farm --config farm.yaml up\n\n  farm worker --agent math --processes 2",
)
@click.option(
    "-c",
    "--config",
    type=click.Path(dir_okay=False),
    envvar="FARM_CONFIG",
    help="YAML settings file (default: $FARM_CONFIG).",
)
@click.option(
    "--redis-url",
    default=None,
    help="Redis URL (default: settings, $FARM_REDIS_URL, else embedded); put a password in "
    "$FARM_REDIS_PASSWORD, not here, where other processes can read it.",
)
@click.option("--namespace", default=None, help="key namespace (default: settings, farm).")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
    default=None,
    help="log level (default: settings, INFO).",
)
@click.option("--debug", is_flag=True, help="show tracebacks on errors.")
@click.version_option(farm.__version__, "--version", prog_name="farm")
@click.pass_context
def cli(ctx: click.Context, config, redis_url, namespace, log_level, debug) -> None:
    """Redis-streams rollout farm for LLM reinforcement learning."""
    if config and os.path.isdir(config):
        raise ConfigError(f"--config {config} is a directory, not a YAML file")
    overrides = {
        k: v
        for k, v in (
            ("redis_url", redis_url),
            ("namespace", namespace),
            ("log_level", log_level.upper() if log_level else None),
        )
        if v is not None
    }
    ctx.obj = Globals(config, overrides, debug)
    s = ctx.obj.settings()  # a bad setting fails here, naming its source, before any work
    setup_logging("DEBUG" if debug else s.log_level, s.log_format)
