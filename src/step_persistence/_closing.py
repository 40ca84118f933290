"""`async with store:` for every store: the context manager that closes what it opened."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self

__all__ = ['ClosesOnExit']


class ClosesOnExit(ABC):
    """Entering returns the object itself; leaving (normally or by an error) awaits its `aclose()`."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release what the object owns (never what its caller passed in)."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
