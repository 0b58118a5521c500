"""What :func:`autoopt.optimize` did to a model: one row per module it looked at, counts, the kernels.

A :class:`Row` says where a module is (its dotted path), what autoopt took it for (``kind``), what
happened (``status``: ``replaced``, ``fused`` into a replaced gated MLP's ``gate_up`` GEMM, ``kept``
as it was, or ``skipped`` by ``skip=``/already optimised), why, and what runs it: the dispatch's
choices at the sizes of the check's two samples, 16 and 32 rows (the kernel and config, or
``torch`` and the fallback reason; ``op@16``/``op@32`` when the two differ). Decode (M = 1) and
long-prefill shapes get their own choices when they first run: :func:`autoopt.nn.dispatch.choices`
lists every choice made in the process.

:class:`OptimizeReport` prints as a table and serialises with :meth:`~OptimizeReport.to_dict`; it
is also the context manager that restores the model on exit::

    with autoopt.optimize(model) as report:
        print(report)
        model.generate(...)
    # the original modules are back here
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = ["STATUSES", "OptimizeReport", "Row"]

#: what can happen to a module.
STATUSES = ("replaced", "fused", "kept", "skipped")


@dataclass(slots=True, kw_only=True)
class Row:
    """One module: path, kind, status, reason, what runs it (``kernels``: ``op -> description``), the
    check's relative error against the original (None when not checked) and its tolerance (a quantized
    replacement's: against its 16-bit layer, within its format's bound), the quantized format (``weight``)."""

    path: str
    kind: str
    status: str
    reason: str = ""
    module: str = ""
    shape: str = ""
    dtype: str = ""
    kernels: dict[str, str] = field(default_factory=dict)
    error: float | None = None
    tolerance: float | None = None
    #: the quantized format its weight runs in (empty: 16-bit)
    weight: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "status": self.status, "reason": self.reason,
                "module": self.module, "shape": self.shape, "dtype": self.dtype, "kernels": dict(self.kernels),
                "error": self.error, "tolerance": self.tolerance, "weight": self.weight}


class OptimizeReport:
    """The outcome of one :func:`autoopt.optimize` call (see the module docstring).

    ``rows`` (every module looked at), ``counts()`` (``kind -> status -> n``), ``replaced`` /
    ``kept`` (the rows with that status), ``extra_bytes`` (memory the replacements hold beyond the
    model's own tensors: 0 for tied gated MLPs), ``backend`` (what runs the replaced modules' ops
    at the sample's size: ``triton``, ``triton-interpreter``, ``torch fallback``, or two of them
    joined by `` + ``), ``choices`` (every dispatch :class:`~autoopt.nn.dispatch.Choice` made so
    far, as dicts, at the time of the report), ``weights`` (what ``weights=`` resolved to: the format,
    None for 16-bit, and why; :class:`~autoopt.nn.weights.WeightChoice` as a dict), ``notes`` (modules kept
    16-bit under ``weights=`` and why), ``memory_bytes`` (the model's parameters and buffers before and after,
    each storage once).
    """

    def __init__(self, *, rows: Sequence[Row], ops: Sequence[str], check: bool, keep_original: bool,
                 extra_bytes: int, backend: str, choices: Sequence[dict[str, Any]] = (),
                 restore: Callable[[], int] | None = None, model: Any = None,
                 weights: dict[str, Any] | None = None, notes: Sequence[str] = (),
                 memory_bytes: tuple[int, int] | None = None) -> None:
        self.rows = list(rows)
        self.ops = tuple(ops)
        self.check = check
        self.keep_original = keep_original
        self.extra_bytes = extra_bytes
        self.backend = backend
        self.choices = list(choices)
        self.weights = dict(weights) if weights else {"asked": None, "format": None,
                                                      "reason": "the model's own 16-bit weights"}
        self.notes = list(notes)
        self.memory_bytes = memory_bytes
        self._restore = restore
        self._model = weakref.ref(model) if model is not None else None

    # -- queries ---------------------------------------------------------------------------------------

    def counts(self) -> dict[str, dict[str, int]]:
        """``kind -> status -> number of modules``."""
        out: dict[str, Counter[str]] = {}
        for r in self.rows:
            out.setdefault(r.kind, Counter())[r.status] += 1
        return {k: dict(v) for k, v in out.items()}

    def count(self, kind: str, status: str = "replaced") -> int:
        return sum(1 for r in self.rows if r.kind == kind and r.status == status)

    @property
    def replaced(self) -> list[Row]:
        return [r for r in self.rows if r.status == "replaced"]

    @property
    def kept(self) -> list[Row]:
        return [r for r in self.rows if r.status == "kept"]

    def row(self, path: str) -> Row:
        """The row of the module at ``path`` (KeyError naming the known paths' count if none)."""
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(f"no module {path!r} in this report ({len(self.rows)} rows)")

    # -- restore ---------------------------------------------------------------------------------------

    @property
    def weight_format(self) -> str | None:
        """The format the linears were quantized into (None: 16-bit)."""
        fmt: str | None = self.weights.get("format")
        return fmt

    def errors(self) -> dict[str, float]:
        """``path -> relative error`` of every quantized replacement against its 16-bit layer (check sample)."""
        return {r.path: r.error for r in self.rows if r.weight and r.status == "replaced" and r.error is not None}

    def restore(self) -> int:
        """Put back the original modules this call replaced; returns how many (0 when done already).
        RestoreError (nothing restored, and it can be asked again) where quantized weights were freed."""
        restore, self._restore = self._restore, None
        try:
            return restore() if restore is not None else 0
        except Exception:
            self._restore = restore
            raise

    def __enter__(self) -> OptimizeReport:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    # -- output ----------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {"ops": list(self.ops), "check": self.check, "keep_original": self.keep_original,
                "backend": self.backend, "extra_bytes": self.extra_bytes, "counts": self.counts(),
                "weights": dict(self.weights), "notes": list(self.notes),
                "memory_bytes": None if self.memory_bytes is None else
                {"before": self.memory_bytes[0], "after": self.memory_bytes[1]},
                "rows": [r.to_dict() for r in self.rows], "choices": list(self.choices)}

    def summary(self) -> str:
        parts = []
        for kind, by_status in self.counts().items():
            parts.append(f"{kind} " + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items())))
        return "; ".join(parts) or "nothing recognised"

    def __str__(self) -> str:
        quant = any(r.weight for r in self.rows)
        headers = ("module", "kind", "status", "shape", "dtype", *(("weights",) if quant else ()), "check",
                   "runs on / reason")
        lines = []
        for r in self.rows:
            check = "-" if r.error is None else f"{r.error:.1e}"
            how = "; ".join(f"{op}: {k}" for op, k in r.kernels.items()) if r.status == "replaced" else r.reason
            if r.status == "replaced" and r.weight and r.reason:
                how = f"{how} [{r.reason}]"
            weight = ((r.weight or ("16-bit" if r.status == "replaced" else "-")),) if quant else ()
            lines.append((r.path, r.kind, r.status, r.shape, r.dtype, *weight, check, how))
        widths = [max(len(h), *(len(str(c[i])) for c in lines)) if lines else len(h) for i, h in enumerate(headers)]
        widths[-1] = len(headers[-1])  # the last column is not padded
        fmt = "  ".join(f"{{:<{w}}}" for w in widths)
        title = (f"autoopt.optimize: {self.summary()} (ops: {', '.join(self.ops)}; "
                 f"check {'on' if self.check else 'off'}; kernels: {self.backend}; "
                 f"extra memory {self.extra_bytes} B)")
        out = [title]
        if self.weight_format is not None or self.weights.get("asked") not in (None, "bf16", "fp16"):
            out.append(f"weights: {self.weight_format or '16-bit'} - {self.weights.get('reason', '')}")
        if self.memory_bytes is not None and self.memory_bytes[0] != self.memory_bytes[1]:
            b, a = self.memory_bytes
            out.append(f"model tensors: {b / 2**20:.2f} MiB -> {a / 2**20:.2f} MiB")
        out += [fmt.format(*headers).rstrip(), "  ".join("-" * w for w in widths)]
        out += [fmt.format(*line).rstrip() for line in lines]
        out += [f"note: {n}" for n in self.notes]
        return "\n".join(out)

    def __repr__(self) -> str:
        return f"<OptimizeReport {self.summary()}>"
