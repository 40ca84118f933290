"""Public names a package imports from their modules on first use, so importing the package stays cheap."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any

__all__ = ['lazy_exports']


def lazy_exports(
    package: str,
    modules: Mapping[str, str],
    namespace: dict[str, Any],
    *,
    prepare: Callable[[str, Any], None] | None = None,
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose public names are imported from `modules` (name ->
    module) on first use, passed to `prepare(name, value)` if given, then kept in `namespace` (the package's
    `globals()`), so the next use is a plain global."""

    def __getattr__(name: str) -> Any:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f'module {package!r} has no attribute {name!r}')
        value = getattr(import_module(module), name)
        if prepare is not None:
            prepare(name, value)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *modules})

    return __getattr__, __dir__
