"""``@autoopt.autotune``: ``triton.autotune``'s drop-in that times only the configs worth timing.

Replacing ``triton.autotune`` by ``autoopt.autotune`` is the whole migration: same arguments
(``configs``, ``key``, ``prune_configs_by``, ``reset_to_zero``, ``restore_value``, ``pre_hook``,
``post_hook``, ``warmup``, ``rep``, ``use_cuda_graph``, ``do_bench``, ``cache_results``), same
attributes (``.configs``, ``.cache``, ``.best_config``, ``.configs_timings``, ``.bench_time``),
same launch (``kernel[grid](...)``). What differs, on a tuning key not seen before:

1. **Rank** the configs (:mod:`autoopt.tuning.config_ranking`): autoopt's calibrated model when
   the kernel is a known template (matmul, GEMV, row reduction), a generic resource model from the
   configs' block sizes, warps and stages otherwise, the user's ``perf_model`` when one is given.
2. **Time only the top ``top_k``** (default :data:`TOP_K`) with Triton's ``do_bench``, in rank
   order. A config that fails to compile (``OutOfResources``, ``CompilationError``,
   ``PTXASError``; under ``TRITON_INTERPRET=1`` any ``InterpreterError``) is skipped with its
   reason, as Triton skips it, and the next config in rank order takes its place, so ``top_k``
   counts configs that ran. With ``reference=`` each config's output is first compared with the
   reference's, and a config that computes the wrong answer is skipped before its time counts.
3. **Store the winner**: in ``.cache`` (per process, as Triton) and in a persistent store keyed by
   the kernel's source, the key's values, the GPU and the Triton version (:mod:`autoopt.tuning.winners`),
   so a second process with the same kernel and shapes times nothing.

``.last_tuning`` (a :class:`Tuning`) says what the latest tuning did. Differences from Triton worth
knowing: an empty ``configs`` list, a ``key`` (or ``reset_to_zero``/``restore_value``/``check``) name
that is not a kernel argument and ``top_k < 1`` raise :class:`~autoopt.errors.ConfigError` (a
``ValueError``) at decoration; and the default ``do_bench`` windows are shorter than Triton's
(:data:`WARMUP_MS`/:data:`REP_MS`, 5/20 ms instead of 25/100) unless ``warmup``/``rep``/``do_bench``
are given.

This module imports triton (the decorator wraps Triton kernels); ``import autoopt`` does not
import it (``autoopt.autotune`` is resolved lazily).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from triton.runtime.jit import KernelInterface

from autoopt._log import get_logger
from autoopt.errors import ConfigError
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.tuning.config_ranking import ConfigRanking, RankedConfig, config_dict, config_label, rank_configs
from autoopt.tuning.winners import JsonWinnerStore, WinnerStore, winner_key

log = get_logger(__name__)

__all__ = ["QUANTILES", "REP_MS", "TOP_K", "WARMUP_MS", "Autotuner", "SkippedConfig", "TimedConfig", "Tuning",
           "autotune"]

#: configs timed per new key when neither ``top_k=`` nor ``prune_configs_by["top_k"]`` says otherwise.
TOP_K = 4
#: what Triton's autotuner asks ``do_bench`` for (median, 20th and 80th percentile); the median decides.
QUANTILES = (0.5, 0.2, 0.8)
#: default do_bench windows of a tuning (ms), when neither ``warmup``/``rep`` nor ``do_bench`` is given.
#: A tuning needs each config's median stable to a percent or two, not a report-grade number, and
#: compiling already costs more than timing. H100, triton 3.6, Triton's tutorial matmul at 7 shapes
#: (benchmarks/results/h100/autotune_vs_triton*.json): 5/20 ms picked configs as fast as
#: triton.autotune's 25/100 (geomean 0.999 of its choice's speed; the same config on 6 of 7 shapes,
#: 0.992 on the seventh) in 0.199 and 0.202 of its tuning time per shape (geomean of two runs),
#: against 0.275 with 10/40. 20 ms is still ~25 repetitions of the slowest kernel there
#: (4096x4096x14336 fp16, ~700 us + do_bench's L2 flush).
WARMUP_MS, REP_MS = 5, 20
_PRUNE_KEYS = frozenset({"perf_model", "top_k", "early_config_prune"})
#: default tolerances of the ``reference=`` check: fp16 accumulations over K ~ 1e3 terms stay
#: within ~1e-2 of an fp32 reference (Triton's matmul tutorial checks fp16 at atol=1e-2).
ATOL, RTOL = 1e-2, 1e-2


# -- what a tuning did ----------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class TimedConfig:
    """A config that ran and was timed: ``do_bench``'s median (ms) and the other quantiles it gave."""

    index: int
    label: str
    ms: float
    quantiles: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "config": self.label, "ms": self.ms, "quantiles": list(self.quantiles)}


@dataclass(frozen=True, slots=True, kw_only=True)
class SkippedConfig:
    """A config that was tried and not timed: failed to compile, or computed the wrong answer."""

    index: int
    label: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "config": self.label, "reason": self.reason}


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuning:
    """One tuning of one key: how the configs were ranked, which ran, which won, how long it took.

    ``index`` fields are positions in the config list tuned (after ``early_config_prune``).
    ``from_store``: the winner came from the persistent store and nothing was timed.
    """

    kernel: str
    key: tuple[Any, ...]
    model: str
    ranked: tuple[RankedConfig, ...]
    timed: tuple[TimedConfig, ...]
    skipped: tuple[SkippedConfig, ...]
    chosen: str
    chosen_index: int
    seconds: float
    from_store: bool
    top_k: int = 0
    op: str = ""
    note: str = ""
    #: seconds spent ranking, compiling the top k in parallel, and running/timing configs one by one.
    phases: Mapping[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "key": [repr(v) for v in self.key], "model": self.model, "op": self.op,
                "note": self.note, "top_k": self.top_k, "ranked": [r.to_dict() for r in self.ranked],
                "timed": [t.to_dict() for t in self.timed], "skipped": [s.to_dict() for s in self.skipped],
                "chosen": self.chosen, "chosen_index": self.chosen_index, "seconds": round(self.seconds, 6),
                "from_store": self.from_store, "phases": {k: round(v, 6) for k, v in self.phases.items()}}


# -- the machine: GPU profile, failure types ------------------------------------------------------

_DETECTED: list[HardwareProfile] = []


def _detected_gpu() -> GPUProfile | None:
    """This machine's first GPU, detected once per process (detection never raises)."""
    if not _DETECTED:
        from autoopt.hardware.detection import detect

        _DETECTED.append(detect())
    return _DETECTED[0].gpu


def _profile_gpu(profile: Any) -> GPUProfile | None:
    if isinstance(profile, GPUProfile):
        return profile
    if isinstance(profile, HardwareProfile):
        return profile.gpu
    if isinstance(profile, (str, os.PathLike)):
        from pathlib import Path

        from autoopt.hardware.library import load_profile

        return load_profile(profile if isinstance(profile, str) else Path(profile)).gpu
    raise ConfigError(f"profile must be a HardwareProfile, a GPUProfile, a known profile name or a profile "
                      f"file path, got {type(profile).__name__}")


def _failure_types(interpreting: bool) -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this config cannot run here", as Triton's autotuner treats them."""
    from triton.compiler import errors as compiler_errors
    from triton.runtime import errors as runtime_errors

    names = ("OutOfResources", "PTXASError") + (("InterpreterError",) if interpreting else ())
    found = [getattr(runtime_errors, n) for n in names if hasattr(runtime_errors, n)]
    return (compiler_errors.CompilationError, *found)


def _wall_clock_bench(fn: Callable[[], Any], quantiles: Sequence[float] | None = None) -> list[float]:
    """Timing under ``TRITON_INTERPRET=1`` (no GPU, no CUDA events): wall clock of 3 calls after one
    warm-up. Interpreted times say nothing about a GPU; they only let the decorator run on a CPU."""
    fn()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    med = statistics.median(times)
    return [med, times[0], times[-1]] if quantiles else [med]


def _times(value: Any) -> tuple[float, ...]:
    """``do_bench``'s answer (a float, or a list of quantiles) as a tuple of floats (median first)."""
    if isinstance(value, (int, float)):
        return (float(value),)
    try:
        return tuple(float(v) for v in value)
    except TypeError:
        raise ConfigError(f"do_bench returned {value!r}; expected milliseconds (a float or a list)") from None


# -- arguments ---------------------------------------------------------------------------------------

def _names(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{what} must be a list of kernel argument names, got {value!r}")
    return list(value)


def _check_top_k(value: Any, what: str, *, fraction: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a positive integer{' or a fraction in (0, 1]' if fraction else ''}, "
                          f"got {value!r}")
    if isinstance(value, int) and value < 1:
        raise ConfigError(f"{what} must be >= 1 (configs timed per new key), got {value}")
    if isinstance(value, float) and not (fraction and 0.0 < value <= 1.0):
        raise ConfigError(f"{what} must be a positive integer{' or a fraction in (0, 1]' if fraction else ''}, "
                          f"got {value!r}")


def _check_decorator_args(configs: Any, key: Any, reset_to_zero: Any, restore_value: Any, prune_configs_by: Any,
                          top_k: Any, reference: Any, check: Any, atol: Any, rtol: Any, store: Any, do_bench: Any,
                          warmup: Any, rep: Any) -> None:
    """Everything that can be checked before seeing the kernel (names are checked in Autotuner)."""
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ConfigError(f"configs must be a non-empty list of triton.Config, got {configs!r}")
    bad = [c for c in configs if not (hasattr(c, "kwargs") and callable(getattr(c, "all_kwargs", None)))]
    if bad:
        raise ConfigError(f"configs must be triton.Config objects, got {type(bad[0]).__name__}: {bad[0]!r}")
    for what, names in (("key", key), ("reset_to_zero", reset_to_zero), ("restore_value", restore_value)):
        _names(names, what)
    if prune_configs_by is not None:
        if not isinstance(prune_configs_by, Mapping):
            raise ConfigError(f"prune_configs_by must be a dict with {sorted(_PRUNE_KEYS)}, got {prune_configs_by!r}")
        unknown = set(prune_configs_by) - _PRUNE_KEYS
        if unknown:
            raise ConfigError(f"prune_configs_by has unknown keys {sorted(unknown)}; expected {sorted(_PRUNE_KEYS)}")
        if prune_configs_by.get("top_k") is not None:
            _check_top_k(prune_configs_by["top_k"], "prune_configs_by['top_k']", fraction=True)
    if top_k is not None:
        _check_top_k(top_k, "top_k", fraction=False)
    if reference is not None and not callable(reference):
        raise ConfigError(f"reference must be a callable (the kernel's arguments -> expected output), "
                          f"got {reference!r}")
    if reference is not None and not check:
        raise ConfigError("reference= needs check= naming the output argument(s) to compare, e.g. check='c_ptr'")
    for name, tol in (("atol", atol), ("rtol", rtol)):
        if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol >= 0:
            raise ConfigError(f"{name} must be a number >= 0, got {tol!r}")
    if not (isinstance(store, (bool, str, os.PathLike)) or store is None or isinstance(store, WinnerStore)):
        raise ConfigError(f"store must be True, False, a path or an object with get(key) and put(key, record), "
                          f"got {type(store).__name__}")
    if do_bench is not None and not callable(do_bench):
        raise ConfigError(f"do_bench must be a callable (kernel_call, quantiles) -> ms, got {do_bench!r}")
    for name, ms in (("warmup", warmup), ("rep", rep)):
        if ms is not None and (isinstance(ms, bool) or not isinstance(ms, (int, float)) or ms <= 0):
            raise ConfigError(f"{name} must be a positive number of milliseconds, got {ms!r}")


def _jit_of(fn: Any) -> Any:
    """The JITFunction (or InterpretedFunction) under any wrapper (``triton.heuristics``)."""
    obj = fn
    while hasattr(obj, "fn") and not inspect.isfunction(obj.fn):
        obj = obj.fn
    return obj


def _source_of(jit: Any, base_fn: Any) -> str:
    src = getattr(jit, "src", None)
    if isinstance(src, str):
        return src
    try:
        return inspect.getsource(base_fn)
    except (OSError, TypeError):  # no source file (exec'd code): the bytecode still identifies it
        code = getattr(base_fn, "__code__", None)
        return repr(code.co_code) if code is not None else repr(base_fn)


def _triton_version() -> str:
    import triton

    return str(getattr(triton, "__version__", "unknown"))


# -- the autotuner ----------------------------------------------------------------------------------

class Autotuner(KernelInterface):
    """A Triton kernel with ranked, top-k autotuning (see the module docstring). Built by :func:`autotune`."""

    def __init__(self, fn: Any, arg_names: Sequence[str], configs: Sequence[Any], key: Sequence[str],
                 reset_to_zero: Sequence[str] | None, restore_value: Sequence[str] | None, *,
                 pre_hook: Callable[..., Any] | None = None, post_hook: Callable[..., Any] | None = None,
                 prune_configs_by: Mapping[str, Any] | None = None, warmup: float | None = None,
                 rep: float | None = None, use_cuda_graph: bool = False,
                 do_bench: Callable[..., Any] | None = None, top_k: int | None = None, profile: Any = None,
                 reference: Callable[..., Any] | None = None, check: str | Sequence[str] | None = None,
                 atol: float = ATOL, rtol: float = RTOL, store: Any = True) -> None:
        self.fn = fn
        self.arg_names = list(arg_names)
        self.configs = list(configs)
        self.keys = list(key)
        self.reset_to_zero = list(reset_to_zero or [])
        self.restore_value = list(restore_value or [])
        self.check = [check] if isinstance(check, str) else list(check or [])
        for what, names in (("key", self.keys), ("reset_to_zero", self.reset_to_zero),
                            ("restore_value", self.restore_value), ("check", self.check)):
            unknown = [n for n in names if n not in self.arg_names]
            if unknown:
                raise ConfigError(f"{what} names {', '.join(map(repr, unknown))}, which "
                                  f"{'is' if len(unknown) == 1 else 'are'} not an argument of the kernel; "
                                  f"its arguments are {', '.join(self.arg_names)}")
        self.cache: dict[tuple[Any, ...], Any] = {}
        self.configs_timings: dict[Any, list[float]] = {}
        self.bench_time = 0.0
        self.best_config: Any = None
        self.nargs: dict[str, Any] | None = None
        self.last_tuning: Tuning | None = None
        self.restore_copies: dict[str, Any] = {}
        self._install_hooks(pre_hook, post_hook)
        prune = dict(prune_configs_by or {})
        self.perf_model: Callable[..., Any] | None = prune.get("perf_model")
        self.early_config_prune: Callable[..., Any] | None = prune.get("early_config_prune")
        self.top_k: int | float = top_k if top_k is not None else prune.get("top_k") or TOP_K
        self.base_fn = fn
        while not inspect.isfunction(self.base_fn):
            self.base_fn = self.base_fn.fn
        self._jit = _jit_of(fn)
        self.interpreting = type(self._jit).__name__ == "InterpretedFunction"
        self.kernel_name = f"{self.base_fn.__module__}.{self.base_fn.__qualname__}"
        self._source = _source_of(self._jit, self.base_fn)
        self._failures = _failure_types(self.interpreting)
        self._user_do_bench = do_bench
        self.num_warmups, self.num_reps, self.use_cuda_graph = warmup, rep, use_cuda_graph
        self._gpu: GPUProfile | None = None
        self._gpu_resolved = False
        if profile is not None:
            self._gpu, self._gpu_resolved = _profile_gpu(profile), True
        self.reference, self.atol, self.rtol = reference, float(atol), float(rtol)
        self.store: WinnerStore | None = self._store_of(store)
        self._logged: set[tuple[str, str]] = set()

    # -- hooks (Triton's semantics: a user hook replaces the reset/restore one) ----------------
    def _install_hooks(self, pre_hook: Callable[..., Any] | None, post_hook: Callable[..., Any] | None) -> None:
        def no_pre(kwargs: dict[str, Any], reset_only: bool = False) -> None:
            return None

        def no_post(kwargs: dict[str, Any], exception: BaseException | None) -> None:
            return None

        def reset_and_save(kwargs: dict[str, Any], reset_only: bool = False) -> None:
            for name in self.reset_to_zero:
                if kwargs[name] is not None:
                    kwargs[name].zero_()
            if not reset_only:
                self.restore_copies = {n: kwargs[n].clone() for n in self.restore_value if kwargs[n] is not None}

        def restore(kwargs: dict[str, Any], exception: BaseException | None) -> None:
            for name, value in self.restore_copies.items():
                kwargs[name].copy_(value)
            self.restore_copies = {}

        self.user_defined_pre_hook = pre_hook is not None
        self.user_defined_post_hook = post_hook is not None
        self.pre_hook: Callable[..., Any] = pre_hook or (
            reset_and_save if (self.reset_to_zero or self.restore_value) else no_pre)
        self.post_hook: Callable[..., Any] = post_hook or (restore if self.restore_value else no_post)

    @staticmethod
    def _store_of(store: Any) -> WinnerStore | None:
        if store is False or store is None:
            return None
        if store is True:
            return JsonWinnerStore()
        if isinstance(store, (str, os.PathLike)):
            return JsonWinnerStore(store)
        return store

    @property
    def gpu(self) -> GPUProfile | None:
        """The GPU the ranking models: ``profile=``, else this machine's (detected on first use)."""
        if not self._gpu_resolved:
            self._gpu, self._gpu_resolved = _detected_gpu(), True
        return self._gpu

    @property
    def do_bench(self) -> Callable[..., Any]:
        """The timer: ``do_bench=``, else Triton's ``do_bench`` (CUDA graphs with ``use_cuda_graph``)."""
        if self._user_do_bench is not None:
            return self._user_do_bench
        if self.interpreting:
            return _wall_clock_bench
        import triton.testing

        rep = self.num_reps if self.num_reps is not None else REP_MS
        if self.use_cuda_graph:
            return lambda fn, quantiles=None: triton.testing.do_bench_cudagraph(fn, rep=rep, quantiles=quantiles)
        warmup = self.num_warmups if self.num_warmups is not None else WARMUP_MS
        return lambda fn, quantiles=None: triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=quantiles)

    # -- launch -----------------------------------------------------------------------------------
    def key_of(self, kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
        """Triton's tuning key: the ``key`` arguments' values, then the dtype of every tensor argument."""
        all_args = {**(self.nargs or {}), **kwargs}
        named = {k: v for k, v in all_args.items() if k in self.arg_names}
        key = [named[k] for k in self.keys if k in named]
        key += [str(v.dtype) for v in named.values() if hasattr(v, "dtype")]
        return tuple(key)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        try:
            if len(self.configs) > 1:
                key = self.key_of(kwargs)
                if key not in self.cache:
                    self.cache[key] = self._tune(key, args, kwargs)
                config = self.cache[key]
            else:
                config = self.configs[0]
            self.best_config = config
            if config.pre_hook is not None:
                config.pre_hook({**self.nargs, **kwargs, **config.all_kwargs()})
            return self.fn.run(*args, **kwargs, **config.all_kwargs())
        finally:
            self.nargs = None

    def warmup(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Compile every config ahead of time (Triton's ``Autotuner.warmup``)."""
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        try:
            return [self.fn.warmup(*args, **kwargs, **c.all_kwargs()) for c in self._early_prune(kwargs)]
        finally:
            self.nargs = None

    # -- tuning -----------------------------------------------------------------------------------
    def _early_prune(self, kwargs: Mapping[str, Any]) -> list[Any]:
        if self.early_config_prune is None:
            return self.configs
        pruned = list(self.early_config_prune(self.configs, self.nargs, **kwargs))
        if not pruned:
            raise ConfigError(f"{self.kernel_name}: early_config_prune returned no config; it must keep at least one")
        return pruned

    def rank(self, *args: Any, **kwargs: Any) -> ConfigRanking:
        """The order a call with these arguments would time the configs in; nothing runs. Indices are
        positions in the config list after ``early_config_prune``."""
        self.nargs = dict(zip(self.arg_names, args, strict=False))
        try:
            return self._rank(self._early_prune(kwargs), kwargs)
        finally:
            self.nargs = None

    def _rank(self, configs: Sequence[Any], kwargs: Mapping[str, Any]) -> ConfigRanking:
        named = {**(self.nargs or {}), **{k: v for k, v in kwargs.items() if k in self.arg_names}}
        if self.perf_model is not None:
            order = []
            for i, c in enumerate(configs):
                score = float(self.perf_model(**(self.nargs or {}), **kwargs, **c.all_kwargs()))
                order.append(RankedConfig(index=i, label=config_label(c), score=score, model="perf_model"))
            order.sort(key=lambda r: (r.score if r.score is not None and math.isfinite(r.score) else math.inf,
                                      r.index))
            return ConfigRanking(model="perf_model", order=tuple(order))
        return rank_configs(configs, named, gpu=self.gpu, kernel=self.base_fn.__name__, key_names=self.keys)

    def _k(self, n: int, ranking: ConfigRanking) -> int:
        if ranking.model == "none":
            return n
        k = self.top_k
        if isinstance(k, float):
            return max(1, min(n, int(n * k)))
        return max(1, min(n, int(k)))

    def _store_key(self, key: tuple[Any, ...], configs: Sequence[Any]) -> str:
        gpu = self.gpu
        return winner_key(kernel=self.kernel_name, source=self._source, key=key,
                          device=gpu.fingerprint if gpu is not None else "no-gpu-profile",
                          triton=_triton_version(), configs=[config_label(c) for c in configs],
                          extra={"interpret": self.interpreting, "target": self._target()})

    def _target(self) -> str:
        """The device Triton compiles for (``cuda:90``): the store key names the GPU that ran the
        timings, even when ``profile=`` describes another one."""
        if self.interpreting:
            return "interpreter"
        try:
            from triton.runtime import driver

            target = driver.active.get_current_target()
            return f"{target.backend}:{target.arch}"
        except Exception:  # no driver: the profile's fingerprint still keys the store
            return "unknown"

    def _from_store(self, skey: str, configs: Sequence[Any]) -> tuple[int, Any] | None:
        if self.store is None:
            return None
        try:
            record = self.store.get(skey)
        except Exception as exc:  # a broken store costs a re-tune, never the kernel launch
            log.warning("%s: autotune store %r failed on get (%s: %s)", self.kernel_name, self.store,
                        type(exc).__name__, exc)
            return None
        if not record:
            return None
        want = record.get("config")
        for i, c in enumerate(configs):
            if json.loads(json.dumps(config_dict(c), default=repr)) == want:
                return i, c
        log.debug("%s: stored winner %r is not among the configs", self.kernel_name, want)
        return None

    def _tune(self, key: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        configs = self._early_prune(kwargs)
        if len(configs) == 1:  # as Triton: one config left, nothing to time
            self.last_tuning = Tuning(kernel=self.kernel_name, key=key, model="single", ranked=(), timed=(),
                                      skipped=(), chosen=config_label(configs[0]), chosen_index=0,
                                      seconds=time.perf_counter() - t0, from_store=False, top_k=0)
            return configs[0]
        skey = self._store_key(key, configs) if self.store is not None else ""
        hit = self._from_store(skey, configs)
        if hit is not None:
            i, config = hit
            self.last_tuning = Tuning(kernel=self.kernel_name, key=key, model="store", ranked=(), timed=(),
                                      skipped=(), chosen=config_label(config), chosen_index=i,
                                      seconds=time.perf_counter() - t0, from_store=True, top_k=0)
            log.info("%s %s: stored winner %s", self.kernel_name, key, config_label(config))
            return config
        t_rank = time.perf_counter()
        ranking = self._rank(configs, kwargs)
        k = self._k(len(configs), ranking)
        t_compile = time.perf_counter()
        self._precompile([configs[r.index] for r in ranking.order[:k]], args, kwargs)
        expected = self._expected(args, kwargs)
        timed: list[TimedConfig] = []
        skipped: list[SkippedConfig] = []
        t_bench = time.perf_counter()
        for r in ranking.order:
            if len(timed) >= k:
                break
            config = configs[r.index]
            why, times = self._try(args, config, kwargs, expected)
            if why:
                skipped.append(SkippedConfig(index=r.index, label=r.label, reason=why))
                self._log_skip(r.label, why)
                continue
            timed.append(TimedConfig(index=r.index, label=r.label, ms=times[0], quantiles=times[1:]))
        self.bench_time = time.perf_counter() - t_bench
        if not timed:
            reasons = "; ".join(f"{s.label}: {s.reason}" for s in skipped[:3])
            raise ConfigError(f"{self.kernel_name}: no config ran for key {key} ({len(skipped)} tried): {reasons}",
                              reasons=tuple(s.reason for s in skipped))
        best = min(timed, key=lambda t: t.ms)  # first of equals: the better-ranked one
        winner = configs[best.index]
        self.configs_timings = {configs[t.index]: [t.ms, *t.quantiles] for t in timed}
        self.pre_hook({**(self.nargs or {}), **kwargs, **winner.all_kwargs()}, reset_only=True)
        if self.store is not None:
            self._put(skey, key, winner, best, ranking.model, len(timed))
        self.last_tuning = Tuning(kernel=self.kernel_name, key=key, model=ranking.model, ranked=ranking.order,
                                  timed=tuple(timed), skipped=tuple(skipped), chosen=best.label,
                                  chosen_index=best.index, seconds=time.perf_counter() - t0, from_store=False,
                                  top_k=k, op=ranking.op, note=ranking.note,
                                  phases={"rank": t_compile - t_rank, "compile": t_bench - t_compile,
                                          "time": self.bench_time})
        log.info("%s %s: %s ranked %d configs, timed %d, skipped %d, chose %s (%.4g ms) in %.2f s",
                 self.kernel_name, key, ranking.model, len(configs), len(timed), len(skipped), best.label, best.ms,
                 self.last_tuning.seconds)
        return winner

    def _put(self, skey: str, key: tuple[Any, ...], winner: Any, best: TimedConfig, model: str, timed: int) -> None:
        assert self.store is not None
        record = {"config": json.loads(json.dumps(config_dict(winner), default=repr)), "label": best.label,
                  "us": best.ms * 1e3, "timed": timed, "model": model, "kernel": self.kernel_name,
                  "key": [repr(v) for v in key], "triton": _triton_version(),
                  "device": self.gpu.name if self.gpu is not None else None, "created": time.time()}
        try:
            self.store.put(skey, record)
        except Exception as exc:
            log.warning("%s: autotune store %r failed on put (%s: %s); the winner is kept in memory only",
                        self.kernel_name, self.store, type(exc).__name__, exc)

    def _log_skip(self, label: str, why: str) -> None:
        if (label, why) not in self._logged:
            self._logged.add((label, why))
            log.info("%s: skipping config %s: %s", self.kernel_name, label, why)

    # -- running one config -----------------------------------------------------------------------
    def _precompile(self, configs: Sequence[Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Compile ``configs`` at once, on threads, before they are timed one by one.

        Compiling is most of a new shape's tuning time (H100, triton 3.6: ~0.7 s per tutorial matmul
        config against ~50 ms to time it; benchmarks/autotune_vs_triton.py) and Triton's compiler
        spends it in C++ passes and ``ptxas`` subprocesses, so the top k build side by side.
        Uses Triton's ``AsyncCompileMode`` (``triton.runtime._async_compile``) where it exists; a
        config that fails to compile here fails again, with its reason, when it is run. Best effort:
        any problem leaves the compiles to the sequential runs."""
        if self.interpreting or len(configs) < 2:
            return
        try:
            from triton.runtime._async_compile import AsyncCompileMode
        except ImportError:
            return
        from concurrent.futures import ThreadPoolExecutor

        meta = {**kwargs, "warmup": True}
        try:
            with ThreadPoolExecutor(max_workers=min(len(configs), os.cpu_count() or 1)) as pool, \
                    AsyncCompileMode(pool, ignore_errors=True):
                for config in configs:
                    if kwargs.keys() & config.kwargs.keys():
                        continue  # the run reports the conflict
                    with contextlib.suppress(Exception):
                        self.fn.run(*args, **meta, **config.all_kwargs())
        except Exception as exc:
            log.debug("%s: parallel compile failed (%s: %s)", self.kernel_name, type(exc).__name__, exc)

    def _expected(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Any] | None:
        """The reference's outputs, one per ``check`` name (computed once per tuning, before any config runs)."""
        if self.reference is None:
            return None
        call_kwargs = {k: v for k, v in kwargs.items() if k in self.arg_names}
        out = self.reference(*args, **call_kwargs)
        if isinstance(out, Mapping):
            missing = [n for n in self.check if n not in out]
            if missing:
                raise ConfigError(f"reference returned no output for check names {missing}")
            return [out[n] for n in self.check]
        if len(self.check) == 1:
            return [out]
        if not isinstance(out, (list, tuple)) or len(out) != len(self.check):
            raise ConfigError(f"reference must return {len(self.check)} outputs (one per check name "
                              f"{self.check}), got {type(out).__name__}")
        return list(out)

    def _try(self, args: tuple[Any, ...], config: Any, kwargs: dict[str, Any],
             expected: list[Any] | None) -> tuple[str, tuple[float, ...]]:
        """Run ``config`` once (compile; check against the reference), then time it.
        ("", times) when it ran, (reason, ()) when it was skipped."""
        conflicts = kwargs.keys() & config.kwargs.keys()
        if conflicts:
            raise ConfigError(f"Conflicting meta-parameters: {', '.join(sorted(conflicts))}. "
                              "Make sure that you don't re-define auto-tuned symbols.")
        current = dict(kwargs, **config.all_kwargs())
        full_nargs = {**(self.nargs or {}), **current}
        named = {**(self.nargs or {}), **kwargs}

        def kernel_call(inspect_output: Callable[[], None] | None = None) -> None:
            if config.pre_hook:
                config.pre_hook(full_nargs)
            self.pre_hook(full_nargs)
            try:
                self.fn.run(*args, **current)
                if inspect_output is not None:
                    inspect_output()
            except Exception as e:
                try:
                    self.post_hook(full_nargs, exception=e)
                finally:
                    raise
            self.post_hook(full_nargs, exception=None)

        try:
            if expected is None:
                kernel_call()  # compiles: a config that cannot compile fails here, before do_bench
            else:
                why = self._check_output(kernel_call, named, expected)
                if why:
                    return why, ()
            times = _times(self.do_bench(kernel_call, quantiles=QUANTILES))
        except self._failures as exc:
            return f"{type(exc).__name__}: {_first_line(exc)}", ()
        if not times or not math.isfinite(times[0]):
            return f"do_bench returned {times!r}", ()
        return "", times

    def _check_output(self, kernel_call: Callable[..., None], named: Mapping[str, Any],
                      expected: list[Any]) -> str:
        """Poison the checked outputs (NaN), run once, compare with the reference; restore them after."""
        outs = [named[n] for n in self.check]
        saved = [o.clone() for o in outs]
        for o in outs:
            if o.is_floating_point():
                o.fill_(float("nan"))
        problems: list[str] = []

        def compare() -> None:
            for name, out, exp in zip(self.check, outs, expected, strict=True):
                problems.extend(_mismatch(name, out, exp, self.atol, self.rtol))

        try:
            kernel_call(compare)
        finally:
            for o, s in zip(outs, saved, strict=True):
                o.copy_(s)
        return problems[0] if problems else ""


def _first_line(exc: BaseException) -> str:
    """The gist of a Triton error: a CompilationError's ``str`` starts with the source excerpt
    ("at 3:4:\n<code>"), its ``error_message`` says what went wrong (a static_assert's message)."""
    message = getattr(exc, "error_message", None)
    text = (message if isinstance(message, str) and message.strip() else str(exc)).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _mismatch(name: str, out: Any, exp: Any, atol: float, rtol: float) -> list[str]:
    import torch

    expected = torch.as_tensor(exp).to(out.device)
    if tuple(expected.shape) != tuple(out.shape):
        return [f"wrong output: reference for {name} has shape {tuple(expected.shape)}, output {tuple(out.shape)}"]
    got, want = out.float(), expected.float()
    if torch.allclose(got, want, atol=atol, rtol=rtol):
        return []
    err = (got - want).abs()
    worst = float(err.nan_to_num(nan=math.inf).max()) if err.numel() else 0.0
    return [f"wrong output: {name} differs from the reference by up to {worst:.3g} (atol={atol}, rtol={rtol})"]


def autotune(configs: Sequence[Any], key: Sequence[str], prune_configs_by: Mapping[str, Any] | None = None,
             reset_to_zero: Sequence[str] | None = None, restore_value: Sequence[str] | None = None,
             pre_hook: Callable[..., Any] | None = None, post_hook: Callable[..., Any] | None = None,
             warmup: float | None = None, rep: float | None = None, use_cuda_graph: bool = False,
             do_bench: Callable[..., Any] | None = None, cache_results: bool = False, *,
             top_k: int | None = None, profile: Any = None, reference: Callable[..., Any] | None = None,
             check: str | Sequence[str] | None = None, atol: float = ATOL, rtol: float = RTOL,
             store: bool | str | os.PathLike[str] | WinnerStore | None = True) -> Callable[[Any], Autotuner]:
    """Decorator for a ``@triton.jit`` function: ``triton.autotune``'s arguments, plus

    - ``top_k``: configs timed per new key (default :data:`TOP_K`; ``prune_configs_by["top_k"]``
      is used when this is not given);
    - ``profile``: the GPU to rank for (a known profile name, a profile file, a
      ``HardwareProfile``/``GPUProfile``); default: this machine, detected once per process;
    - ``reference``: ``callable(*args, **kwargs) -> expected output(s)`` with ``check``: the name(s)
      of the output argument(s) to compare (``atol``/``rtol``); a config whose output differs is
      skipped before it is timed;
    - ``store``: persist winners (``True``: the default JSON file, see
      :func:`autoopt.tuning.winners.default_path`; a path; an object with ``get``/``put``;
      ``False``: memory only).

    ``cache_results`` is accepted for Triton compatibility; persistence is ``store``'s job.
    Raises :class:`~autoopt.errors.ConfigError` for invalid arguments.
    """
    _check_decorator_args(configs, key, reset_to_zero, restore_value, prune_configs_by, top_k, reference, check,
                          atol, rtol, store, do_bench, warmup, rep)
    check_names = [check] if isinstance(check, str) else _names(check, "check")
    del cache_results

    def decorator(fn: Any) -> Autotuner:
        if not (hasattr(fn, "arg_names") and callable(getattr(fn, "run", None))):
            raise ConfigError(f"autoopt.autotune decorates a @triton.jit function, got {type(fn).__name__}")
        return Autotuner(fn, fn.arg_names, configs, key, reset_to_zero, restore_value, pre_hook=pre_hook,
                         post_hook=post_hook, prune_configs_by=prune_configs_by, warmup=warmup, rep=rep,
                         use_cuda_graph=use_cuda_graph, do_bench=do_bench, top_k=top_k, profile=profile,
                         reference=reference, check=check_names, atol=atol, rtol=rtol, store=store)

    return decorator

