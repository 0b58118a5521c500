"""Profile lookup that also sees plugin-contributed known-hardware profiles.

Built-in profiles are tried first; plugins (whose discovery costs tens of
milliseconds) are loaded only when a name is not among them.
"""

from __future__ import annotations

from pathlib import Path

from autoopt.errors import UnknownProfileError
from autoopt.hardware.profile import HardwareProfile

__all__ = ["known_profiles", "load_profile", "plugin_profile_dirs"]


def plugin_profile_dirs() -> tuple[str, ...]:
    """Profile dirs/files contributed by installed plugins (loads plugins once)."""
    from autoopt.plugins.manager import get_plugin_manager

    return tuple(str(p) for p in get_plugin_manager().profile_dirs())


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A known profile by name (built-in or plugin), or a profile file by path."""
    from autoopt.hardware import library

    try:
        return library.load_profile(name_or_path)
    except UnknownProfileError:
        extra = plugin_profile_dirs()
        if not extra:
            raise
        return library.load_profile(name_or_path, extra_dirs=extra)


def known_profiles(*, include_plugins: bool = True) -> tuple:
    """Every known device (built-in, then plugin-contributed)."""
    from autoopt.hardware import library

    extra = plugin_profile_dirs() if include_plugins else ()
    return library.known_devices(extra_dirs=extra)
