"""Example budgets for the property tests, scaled by the Hypothesis profile in force.

Each property test names the budget it runs with in CI (``budget(200)``); the profile loaded by
``conftest.py`` scales it: ``ci``/``dev`` run it as written, ``explore`` (``pytest
--hypothesis-profile explore``) runs :data:`EXPLORE_FACTOR` times as many examples, the long hunt a
developer makes before a release. A bare ``@settings(max_examples=N)`` would pin N under every
profile, so the tests go through here instead.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

#: the profiles' base example count (Hypothesis' own default); a test's budget is relative to it
BASE_EXAMPLES = 100
#: how many times the CI budget ``explore`` runs: 25 unless ``AUTOOPT_EXPLORE_FACTOR`` says (a release
#: hunt on a many-core machine runs e.g. 200 with ``pytest -n``)
EXPLORE_FACTOR = int(os.environ.get("AUTOOPT_EXPLORE_FACTOR") or 25)


def scaled(examples: int) -> int:
    """``examples`` scaled by the loaded profile (``settings.default.max_examples`` over the base)."""
    return max(1, examples * settings.default.max_examples // BASE_EXAMPLES)


def budget(examples: int) -> settings:
    """Settings for a property test whose CI budget is ``examples``: no deadline (the interpreter and a
    2-core CI box make timings meaningless), slow data generation allowed."""
    return settings(max_examples=scaled(examples), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
