"""Names a package re-exports from its modules, imported on first use (PEP 562), so importing the
package stays cheap: `farm` for the workers, `trainer` without torch and TRL."""

from __future__ import annotations

import sys
from importlib import import_module
from typing import Any, Callable

__all__ = ["lazy_exports"]


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
