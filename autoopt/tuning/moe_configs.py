"""Measured fused-MoE configs: tune the ``fused_moe`` op at each M of a runtime's config file and keep
the winners as ``measured`` entries (``autoopt export moe-configs --tune``).

``measure`` is the tuning run itself (:func:`autoopt.tuning.campaign.tune_ops` on this GPU, or
:func:`autoopt.fleet.jobs.tune` over ``--gpus``), injected so the wiring is testable without a GPU.
The timings are of autoopt's fused-MoE kernel, which takes the runtimes' config keys with the same
meaning; an M where no config matched the reference keeps the zero-shot entry, labelled predicted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from autoopt.errors import AutooptError
from autoopt.kernels.ops import OpSpec
from autoopt.planning.moe_configs import MoeChooser, fused_moe_op
from autoopt.runtimes.moe_configs import M_VALUES, MoeEntry, MoeShard
from autoopt.tuning.campaign import TunedOp

__all__ = ["Measure", "tuned_entries"]

#: runs tuning over (name, op) pairs and returns one TunedOp per pair, same names
Measure = Callable[[list[tuple[str, OpSpec]]], Sequence[TunedOp]]


def tuned_entries(shard: MoeShard, measure: Measure, fallback: MoeChooser, ms: Iterable[int] = M_VALUES
                  ) -> dict[int, MoeEntry]:
    """One entry per M: the fastest config whose output matched the reference (``measured``), else
    ``fallback``'s (predicted, its source saying that tuning found none)."""
    ms = sorted(set(ms))
    named = [(f"fused_moe M={m}", fused_moe_op(shard, m)) for m in ms]
    done = {t.name: t for t in measure(named)}
    out: dict[int, MoeEntry] = {}
    for m, (name, _) in zip(ms, named, strict=True):
        tuned = done.get(name)
        if tuned is None:
            raise AutooptError(f"tuning returned nothing for {name}; got {', '.join(done) or 'nothing'}")
        best = tuned.result.best
        if best is None:
            zs = fallback(shard, m)
            out[m] = MoeEntry(params=zs.params, label=zs.label, predicted_us=zs.predicted_us,
                              measured_us=zs.measured_us,
                              source=f"no tuned config matched the reference in {len(tuned.result.trials)} trials; "
                                     f"{zs.source}")
            continue
        out[m] = MoeEntry(params=best.config.params, label="measured", predicted_us=best.predicted_us,
                          measured_us=best.us, source=f"autoopt tune: {best.config.kernel}, "
                                                      f"{len(tuned.result.trials)} trials ({tuned.result.stopped})")
    return out
