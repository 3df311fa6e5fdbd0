"""Code imported when it is used: the names a package re-exports from its modules (PEP 562), so
importing the package stays cheap (`farm` for the workers, `trainer` without torch and TRL), and
the `module:attr` a config names (an environment class, a harness function)."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable

__all__ = ["import_object", "lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The package's `__getattr__` and `__dir__` for `exports` (name -> the module defining it)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        setattr(sys.modules[package], name, value)  # found once; later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted([*vars(sys.modules[package]), *exports])

    return __getattr__, __dir__


def import_object(spec: str) -> Any:
    """The object `module:attr` names (`attr` may be dotted); the import's own errors propagate, for
    the caller to say whose they are."""
    module, _, attr = spec.partition(":")
    obj: Any = import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
