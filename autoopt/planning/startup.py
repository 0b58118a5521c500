"""What a cold :func:`~autoopt.planning.recommendation.recommend` reads from disk instead of computing,
and the one command that regenerates it: ``python benchmarks/regen_startup_cache.py`` (:func:`regenerate`).

- the shipped rank cache (:mod:`autoopt.search.rank_cache`): :func:`collect_ops` runs ``recommend()``
  for every built-in profile x catalog model x runtime (none and every built-in one) x preference at
  the default workload and records every (GPU, op) it asks rank() about; :func:`rank_ops` ranks each
  with the built-in templates and the default cost constants; one file per GPU;
- the JSON mirrors of the shipped YAML (:mod:`autoopt.hardware.yaml_mirror`, :func:`write_mirrors`).

Run it after changing a template, the cost model, a profile or the catalog (or anything else
:mod:`autoopt.search.rank_cache` lists); until then the old files are found stale on use and
ignored (same answers, a slower first call). ~1 minute on a 2-core box.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from autoopt._log import get_logger
from autoopt.errors import AutooptError
from autoopt.hardware.library import known_names, load_profile
from autoopt.hardware.profile import GPUProfile, HardwareProfile
from autoopt.kernels.config import Candidate
from autoopt.kernels.cost import DEFAULT_CONSTANTS, using
from autoopt.kernels.gpu_key import gpu_key
from autoopt.kernels.ops import OpSpec
from autoopt.planning import recommendation as rec
from autoopt.planning.catalog import model_names
from autoopt.runtimes.builtin import BUILTIN_RUNTIMES

log = get_logger(__name__)

__all__ = ["PREFERENCES", "collect_ops", "rank_ops", "regenerate", "write_mirrors"]

PREFERENCES = ("balanced", "speed", "quality")
_OpKey = tuple[object, ...]


def collect_ops(profiles: Iterable[str] | None = None, models: Iterable[str] | None = None,
                runtimes: Sequence[str | None] | None = None,
                preferences: Sequence[str] = PREFERENCES) -> list[tuple[GPUProfile, OpSpec]]:
    """Every (GPU, op) the default-workload ``recommend()`` ranks for these profiles (default: the
    built-in ones), catalog models (default: all) and runtimes (default: none and every built-in one),
    in first-asked order, one per (GPU key, op)."""
    names = list(profiles) if profiles is not None else list(known_names())
    catalog = list(models) if models is not None else list(model_names())
    rts = list(runtimes) if runtimes is not None else [None, *(d["name"] for d in BUILTIN_RUNTIMES)]
    seen: dict[_OpKey, tuple[GPUProfile, OpSpec]] = {}
    saved, rec._RECORD = rec._RECORD, []
    try:
        # with the default constants, as the cache is built: which ops are asked depends on the answers
        # (the head runs in the mode the layer plan chose), and calibrated constants would move those
        with using(DEFAULT_CONSTANTS):
            for name in names:
                _collect(load_profile(name), catalog, rts, preferences, seen)
    finally:
        rec._RECORD = saved
    return list(seen.values())


def _collect(hw: HardwareProfile, catalog: Sequence[str], rts: Sequence[str | None], preferences: Sequence[str],
             seen: dict[_OpKey, tuple[GPUProfile, OpSpec]]) -> None:
    """Run ``recommend()`` for one profile over the cross product and add what it ranked to ``seen``."""
    recorded = rec._RECORD
    assert recorded is not None
    for model in catalog:
        for rt in rts:
            for preference in preferences:
                try:
                    rec.recommend(hw, model, runtime=rt, preference=preference)
                except AutooptError as exc:  # a runtime that cannot run the model here: nothing ranked
                    log.debug("%s / %s / %s: %s", hw.name, model, rt, exc)
    for gpu, op in recorded:
        seen.setdefault((gpu_key(gpu), op.kind, op.shape, op.dtype, op.layout, op.out_dtype, op.weight, op.moe_gemm),
                        (gpu, op))
    recorded.clear()


def rank_ops(ops: Iterable[tuple[GPUProfile, OpSpec]]) -> list[tuple[GPUProfile, OpSpec, Candidate | AutooptError]]:
    """rank()'s predicted best (or its error) for each (GPU, op): built-in templates, default constants,
    no measured winners, as the shipped cache stores them."""
    from autoopt.search.ranking import rank

    out: list[tuple[GPUProfile, OpSpec, Candidate | AutooptError]] = []
    with using(DEFAULT_CONSTANTS):
        for gpu, op in ops:
            try:
                answer: Candidate | AutooptError = rank(gpu, op, top=3, measured=False, calibrated=False).best
            except AutooptError as exc:
                answer = exc
            out.append((gpu, op, answer))
    return out


def write_mirrors() -> list[Path]:
    """Rewrite the JSON mirrors of the shipped YAML (profiles, model catalog; see
    :mod:`autoopt.hardware.yaml_mirror`); returns them."""
    from autoopt._paths import profiles_dir
    from autoopt.hardware import library, yaml_mirror
    from autoopt.planning import catalog

    return [yaml_mirror.write(sorted(profiles_dir().glob("*.yaml")), library.MIRROR),
            yaml_mirror.write([catalog._DATA], catalog.MIRROR)]


def regenerate(folder: Path | None = None) -> list[Path]:
    """Rebuild the YAML mirrors and the shipped rank cache (see the module doc); returns the files written."""
    from autoopt.plugins.manager import AUTOLOAD_ENV, reset_plugin_manager
    from autoopt.search import rank_cache

    # the cache holds the built-in templates' answers: no installed plugin may take part
    before = os.environ.get(AUTOLOAD_ENV)
    os.environ[AUTOLOAD_ENV] = "1"
    reset_plugin_manager()
    try:
        mirrors = write_mirrors()
        ops = collect_ops()
        answers = rank_ops(ops)
        return [*mirrors, *rank_cache.write(answers, folder or rank_cache.SHIPPED_DIR,
                                            constants=DEFAULT_CONSTANTS.to_dict())]
    finally:
        if before is None:
            os.environ.pop(AUTOLOAD_ENV, None)
        else:
            os.environ[AUTOLOAD_ENV] = before
        reset_plugin_manager()
