"""Benchmark recommended configs against PyTorch on the same inputs, same timer.

Each (op, config) goes through :func:`autoopt.backend.runner.evaluate` (validate,
poison, check, ``do_bench`` median), then the plain-PyTorch equivalent
(cuBLAS / ATen, see ``registry.torch_baseline``) is timed with the same
``do_bench`` call on the same tensors; ``ratio = torch_us / ours_us`` (> 1: ours
is faster). :func:`recommended_cases` asks the templates' ranking (no timing)
for each op's top config, which is what ``autoopt bench`` measures.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from autoopt._log import get_logger
from autoopt.backend import registry, runner
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

log = get_logger(__name__)

__all__ = ["BenchRow", "format_table", "recommended_cases", "run_bench"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRow:
    """One benchmarked config next to PyTorch on the same inputs."""

    result: runner.Result
    torch_us: float | None = None
    ratio: float | None = None

    @property
    def op(self) -> OpSpec:
        return self.result.op

    @property
    def config(self) -> KernelConfig:
        return self.result.config

    @property
    def label(self) -> str:
        return self.result.label

    @property
    def shape(self) -> str:
        return "x".join(map(str, self.op.shape))

    def to_dict(self) -> dict[str, Any]:
        out = self.result.to_dict()
        out["shape"] = self.shape
        out["torch_us"] = None if self.torch_us is None else round(self.torch_us, 4)
        out["ratio_vs_torch"] = None if self.ratio is None else round(self.ratio, 3)
        return out


def recommended_cases(gpu: GPUProfile, ops: Iterable[OpSpec], *, top: int = 1
                      ) -> list[tuple[OpSpec, KernelConfig]]:
    """The ranking's top ``top`` configs for each op (predicted, zero timing), in op order."""
    from autoopt.search.ranking import rank

    cases: list[tuple[OpSpec, KernelConfig]] = []
    for op in ops:
        cases += [(op, c.config) for c in rank(gpu, op, top=top).candidates]
    return cases


#: PyTorch's time per (op, seed, windows) in this process: ``bench --top K`` times K configs of one op
#: beside one torch timing, not K (on the 2 x H200, re-timing torch per row was ~0.25 s of every row's
#: ~0.5 s: benchmarks/results/h200x2/fleet_cli_bench.json against fleet_scaling.json)
_TORCH_US: dict[tuple[Any, ...], float | None] = {}


def _torch_us(op: OpSpec, seed: int, warmup_ms: int, rep_ms: int) -> float | None:
    """PyTorch's time on the very tensors ``evaluate`` just used, timed once per op, seed and windows."""
    key = (*runner.inputs_key(op, "cuda", seed), warmup_ms, rep_ms)
    if key not in _TORCH_US:
        if len(_TORCH_US) >= 256:
            _TORCH_US.clear()
        _TORCH_US[key] = _time_torch(op, seed, warmup_ms, rep_ms)
    return _TORCH_US[key]


def _time_torch(op: OpSpec, seed: int, warmup_ms: int, rep_ms: int) -> float | None:
    import triton.testing

    inputs, _ = runner._inputs_and_reference(op, "cuda", seed)
    fn = registry.torch_baseline(inputs, op)
    if fn is None:
        return None
    try:
        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")) * 1e3
    except Exception as exc:  # e.g. _scaled_mm refusing a shape: no baseline, not a failure of ours
        log.warning("torch baseline for %s failed: %s", op.label(), exc)
        return None


class _Progress:
    """rich progress bar when rich is importable and stderr is a terminal, else one line per step."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled, self.done, self._bar, self._task = total, enabled, 0, None, None
        if not enabled:
            return
        try:
            from rich.progress import Progress

            if sys.stderr.isatty():
                self._bar = Progress(transient=False)
                self._bar.start()
                self._task = self._bar.add_task("benchmarking", total=total)
        except ImportError:
            self._bar = None

    def step(self, text: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self._bar is not None and self._task is not None:  # the task is added with the bar
            self._bar.update(self._task, advance=1, description=text[:60])
        else:
            print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def run_bench(cases: Iterable[tuple[OpSpec, KernelConfig]], gpu: GPUProfile | None, *, progress: bool = True,
              validate: Callable[[OpSpec, KernelConfig], list[str]] | None = None,
              predict: Callable[[OpSpec, KernelConfig], float] | None = None,
              seed: int = 0, warmup_ms: int = 25, rep_ms: int = 100) -> list[BenchRow]:
    """Evaluate each case and time PyTorch beside it; rows keep the input order."""
    cases = list(cases)
    bar = _Progress(len(cases), progress)
    rows: list[BenchRow] = []
    try:
        for op, config in cases:
            res = runner.evaluate(op, config, gpu=gpu, validate=validate, predict=predict, seed=seed,
                                  warmup_ms=warmup_ms, rep_ms=rep_ms)
            torch_us = ratio = None
            if res.label in ("measured", "withheld") and res.us:
                torch_us = _torch_us(op, seed, warmup_ms, rep_ms)
                ratio = torch_us / res.us if torch_us else None
            rows.append(BenchRow(result=res, torch_us=torch_us, ratio=ratio))
            us = f"{res.us:.1f} us" if res.us is not None else "-"
            bar.step(f"{op.label()} {config.kernel}: {res.label} {us}")
    finally:
        bar.close()
    return rows


def format_table(rows: Iterable[BenchRow]) -> str:
    """A fixed-width text table: shape, kernel, config, µs, TFLOP/s, GB/s, % roofline, vs torch, label."""
    head = f"{'op':<10}{'shape':<18}{'kernel':<16}{'us':>10}{'TFLOP/s':>9}{'GB/s':>8}{'%roof':>7}" \
           f"{'torch us':>10}{'ratio':>7}  {'label':<9} config"
    lines = [head]
    for r in rows:
        res = r.result

        def f(v: float | None, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)
        lines.append(f"{r.op.kind:<10}{r.shape:<18}{r.config.kernel:<16}{f(res.us, '.2f'):>10}"
                     f"{f(res.tflops, '.1f'):>9}{f(res.gbs, '.0f'):>8}{f(res.roofline_pct, '.1f'):>7}"
                     f"{f(r.torch_us, '.2f'):>10}{f(r.ratio, '.2f'):>7}  {res.label:<9} {r.config.describe()}"
                     + (f"  ({res.reason})" if res.reason and res.label != "measured" else ""))
    return "\n".join(lines)
