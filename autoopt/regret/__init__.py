"""Measured regret: do recommend()'s choices measure fastest on this host?

:mod:`autoopt.regret.options` lists the alternatives recommend() weighs (weight formats optimize() runs,
CUDA graphs on or off, batches, GPU layouts) as data; :mod:`autoopt.regret.run` builds, optimises and
times each runnable one (a multi-GPU layout in a torchrun group running :mod:`autoopt.regret.distributed`),
and reports per workload the recommended option, the measured best, the regret and every option's
predicted against measured decode step. ``autoopt check regret`` is its command.
"""

from __future__ import annotations

from autoopt.regret.options import BATCHES, FORMATS, Option, RegretOptionError, enumerate_options, parse_batches

__all__ = ["BATCHES", "FORMATS", "Option", "RegretOptionError", "enumerate_options", "parse_batches"]
