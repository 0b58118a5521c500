"""Fitting the cost model's constants to measured timings.

The search stage owns this (not the cost model) because a fit predicts each sample the way the
ranking does, through :func:`autoopt.search.ranking.predict_config`, template by template.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import fields, replace

from autoopt.errors import AutooptError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.cost import CostConstants, constants, using
from autoopt.kernels.ops import OpSpec
from autoopt.search.ranking import predict_config

log = logging.getLogger(__name__)

__all__ = ["Sample", "fit_constants"]

#: (gpu, op, config, measured_us): one checked timing.
Sample = tuple[GPUProfile, OpSpec, KernelConfig, float]


def _loss(samples: Sequence[Sample], consts: CostConstants) -> float:
    total = 0.0
    with using(consts):
        for gpu, op, config, measured in samples:
            pred = predict_config(gpu, op, config)
            total += (math.log(pred.us) - math.log(measured)) ** 2
    return total / len(samples)


def fit_constants(samples: Sequence[Sample], *, start: CostConstants | None = None,
                  names: Sequence[str] | None = None, rounds: int = 8) -> CostConstants:
    """Fit constants to measured timings: coordinate search on mean squared log-error.

    ``samples``: (gpu, op, config, measured_us). Each round tries multiplying
    every named constant by 1.5, 1.2, 1.05 and 1.01 (and their inverses),
    keeping any improvement, until a round improves nothing; fractions stay in
    (0, 1]. Returns the best constants found.
    """
    if not samples:
        raise AutooptError("fit_constants needs at least one (gpu, op, config, measured_us) sample")
    for i, s in enumerate(samples):
        if len(s) != 4 or not (isinstance(s[3], (int, float)) and s[3] > 0):
            raise AutooptError(f"sample {i}: expected (gpu, op, config, measured_us > 0), got {s!r}")
    best = start or constants()
    keys = list(names or [f.name for f in fields(CostConstants)])
    unknown = set(keys) - {f.name for f in fields(CostConstants)}
    if unknown:
        raise AutooptError(f"fit_constants: unknown constants {sorted(unknown)}")
    fractions = {"tc_efficiency", "mma_sync_fraction", "dram_efficiency", "l2_usable_fraction",
                 "persistent_fill_fraction", "pointer_wgmma_efficiency", "single_warpgroup_efficiency",
                 "stream_dram_efficiency",
                 "narrow_wgmma_efficiency"}
    best_loss = _loss(samples, best)
    for _ in range(rounds):
        improved = False
        for key in keys:
            for step in (1.5, 1.2, 1.05, 1.01):  # coarse to fine, both directions
                for factor in (step, 1 / step):
                    value = getattr(best, key) * factor
                    if key in fractions:
                        value = min(value, 1.0)
                    trial = replace(best, **{key: value})
                    loss = _loss(samples, trial)
                    if loss < best_loss - 1e-12:
                        best, best_loss, improved = trial, loss, True
        if not improved:
            break
    log.info("fit_constants: mean squared log-error %.4f over %d samples", best_loss, len(samples))
    return best
