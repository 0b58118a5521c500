"""Module loggers that import :mod:`logging` on their first use, not at import.

``import logging`` brings traceback, textwrap, string and atexit with it: ~4 ms of the ~100 ms a
runtime may spend on a cold ``recommend()`` (2-core CI box), for loggers that a clean start-up never
calls. ``log = get_logger(__name__)`` is used as ``logging.getLogger(__name__)`` is: every attribute
(``debug``, ``warning``, ``isEnabledFor``, ``setLevel``, ...) is the real logger's, looked up when it
is first needed, so handlers, levels and pytest's ``caplog`` see the same logger by the same name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import logging

__all__ = ["get_logger"]


class _DeferredLogger:
    """Stands in for ``logging.getLogger(name)`` until an attribute of it is asked for."""

    __slots__ = ("_name", "_real")

    def __init__(self, name: str) -> None:
        self._name = name
        self._real: logging.Logger | None = None

    def __getattr__(self, attr: str) -> Any:
        real = self._real
        if real is None:
            import logging

            real = self._real = logging.getLogger(self._name)
        return getattr(real, attr)

    def __repr__(self) -> str:
        return f"<deferred logger {self._name}>"


def get_logger(name: str) -> logging.Logger:
    """The logger called ``name``, importing :mod:`logging` when it is first used."""
    return cast("logging.Logger", _DeferredLogger(name))
