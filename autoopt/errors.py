"""The one exception tree of autoopt.

Every error autoopt raises on purpose derives from :class:`AutooptError`, so a
caller can catch them all with one ``except``. Messages say what was wrong,
where, and what would be right::

    AutooptError
    ├── ProfileError          a hardware profile (file, name or field) is invalid
    │   └── UnknownProfileError   no known profile has that name (suggests close ones)
    ├── OpError               an op description (kind, shape, dtype) is invalid
    ├── ConfigError           a kernel config breaks a hard constraint (never launched)
    ├── PluginError           a plugin failed and ``strict=True`` made it fatal
    ├── ModelError            a model description is invalid or unknown
    ├── RuntimeRuleError      a serving runtime is unknown, or its rules refuse the request
    │                         (a format, split or option it cannot run; says what would work)
    ├── WeightFormatError     optimize(weights=) names a format that is unknown or cannot run on
    │                         this GPU (lists the accepted ones / names what would run instead)
    ├── RestoreError          restore() needs original weights that optimize() freed (names them)
    ├── BackendError          the kernel backend cannot run here (no torch/triton/GPU)
    ├── TraceError            a profiler trace is unreadable, not a trace, or has no GPU kernels
    ├── StoreError            the results store or a results file is unusable (corrupt, not
    │                         autoopt's, a newer schema, or a row or field of it is invalid)
    └── ExportError           a file autoopt writes for a runtime cannot be written where asked (the
                              folder is a file or unwritable, or a file there is not autoopt's)

Detection never raises: what it cannot see is recorded in the profile instead.
"""

from __future__ import annotations

__all__ = [
    "AutooptError",
    "BackendError",
    "ConfigError",
    "ExportError",
    "ModelError",
    "OpError",
    "PluginError",
    "ProfileError",
    "RestoreError",
    "RuntimeRuleError",
    "StoreError",
    "TraceError",
    "UnknownProfileError",
    "WeightFormatError",
]


class AutooptError(Exception):
    """Root of every error autoopt raises on purpose."""


class ProfileError(AutooptError, ValueError):
    """A hardware profile is invalid: names the file (if any) and the field."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        self.source = source
        self.field = field
        where = ""
        if source:
            where += f"{source}: "
        if field:
            where += f"field '{field}': "
        super().__init__(where + message)


class UnknownProfileError(ProfileError, LookupError):
    """No known-hardware profile has the requested name."""

    def __init__(self, name: str, suggestions: list[str] | tuple[str, ...] = ()) -> None:
        self.name = name
        self.suggestions = tuple(suggestions)
        hint = f"; did you mean {', '.join(repr(s) for s in self.suggestions)}?" if self.suggestions else ""
        super().__init__(f"unknown profile {name!r}{hint} (`autoopt profiles` lists them)")


class OpError(AutooptError, ValueError):
    """An op description is invalid (unknown kind, bad shape or dtype)."""


class ConfigError(AutooptError, ValueError):
    """A kernel config breaks a hard constraint; it is rejected before launch."""

    def __init__(self, message: str, *, reasons: tuple[str, ...] = ()) -> None:
        self.reasons = tuple(reasons)
        super().__init__(message)


class PluginError(AutooptError):
    """A plugin raised, returned garbage or emitted an invalid config (fatal only when strict)."""

    def __init__(self, message: str, *, plugin: str | None = None, hook: str | None = None) -> None:
        self.plugin = plugin
        self.hook = hook
        super().__init__(message)


class ModelError(AutooptError, ValueError):
    """A model description is invalid, names the offending field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(f"field '{field}': {message}" if field else message)


class RuntimeRuleError(AutooptError, ValueError):
    """A serving runtime (vLLM, SGLang, llama.cpp, ...) is unknown or its rules refuse the request: names
    the runtime and the rule, and what would work instead."""

    def __init__(self, message: str, *, runtime: str | None = None, rule: str | None = None) -> None:
        self.runtime = runtime
        self.rule = rule
        super().__init__(f"{runtime}: {message}" if runtime else message)


class WeightFormatError(AutooptError, ValueError):
    """A weight format asked of :func:`autoopt.optimize` is unknown, or cannot run on the GPU the kernels are
    ranked for: names the format (``format``), the GPU (``gpu``) and what would run instead (``instead``)."""

    def __init__(self, message: str, *, format: str | None = None, gpu: str | None = None,
                 instead: str | None = None) -> None:
        self.format = format
        self.gpu = gpu
        self.instead = instead
        super().__init__(message)


class RestoreError(AutooptError, RuntimeError):
    """:func:`autoopt.restore` cannot put the original modules back because :func:`autoopt.optimize` freed
    their 16-bit weights when it quantized them: ``freed`` names them (nothing is changed)."""

    def __init__(self, message: str, *, freed: tuple[str, ...] = ()) -> None:
        self.freed = tuple(freed)
        super().__init__(message)


class BackendError(AutooptError, RuntimeError):
    """The kernel backend cannot run here (torch, triton or a GPU is missing)."""


class StoreError(AutooptError):
    """The results store or a results file cannot be used: names the file, and the row and field
    of a results file when one of its rows is invalid."""

    def __init__(self, message: str, *, source: str | None = None, row: int | None = None,
                 field: str | None = None) -> None:
        self.source = source
        self.row = row
        self.field = field
        where = f"{source}: " if source else ""
        if row is not None:
            where += f"row {row}: "
        if field:
            where += f"field '{field}': "
        super().__init__(where + message)


class TraceError(AutooptError, ValueError):
    """A profiler trace cannot be used: names the file and what is wrong with it (truncated, not a
    Chrome/Perfetto trace, a CPU-only trace, no GPU kernels)."""

    def __init__(self, message: str, *, source: str | None = None) -> None:
        self.source = source
        super().__init__(f"{source}: {message}" if source else message)


class ExportError(AutooptError, ValueError):
    """A file for a serving runtime (its fused-MoE kernel configs) cannot be written where asked: names the
    path, what is wrong there and what would work (another folder, or ``force`` to replace a file that is
    not autoopt's)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)
