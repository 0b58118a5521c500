"""Walk-through: writing an autoopt template plugin (runs as is: `python examples/write_a_template_plugin.py`).

A plugin is an installable package whose ``pyproject.toml`` names a module in the
``autoopt`` entry-point group::

    [project.entry-points.autoopt]
    blackwell = "autoopt_blackwell.plugin"

That module implements hooks with ``pluggy.HookimplMarker("autoopt")``:

- ``autoopt_templates() -> list[Template]``: template instances. A template
  subclasses ``autoopt.template.Template`` and implements ``applies`` (which ops
  and GPUs), ``space`` (candidate configs), ``validate`` (hard constraints, reusing
  ``autoopt.constraints``) and ``predict`` (reusing ``autoopt.cost.predict_matmul``).
- ``autoopt_choose_path(gpu, op)`` / ``autoopt_choose_impl(gpu, kernel_class)``:
  return a ``PathChoice``/``ImplChoice`` to override the built-in answer, or None.
- ``autoopt_profile_dirs()``: folders of known-hardware YAML profiles.

The complete example is ``plugins/autoopt-blackwell`` (tcgen05 2-CTA cluster GEMMs
for B200). Installed (``pip install ./plugins/autoopt-blackwell``) it is found
through its entry point; here it is registered directly, so this script runs
from a source checkout without installing anything.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "plugins" / "autoopt-blackwell")]

from autoopt.hardware.library import load_profile  # noqa: E402
from autoopt.kernels.ops import OpSpec  # noqa: E402
from autoopt.plugins.manager import PluginManager, reset_plugin_manager  # noqa: E402
from autoopt.search.ranking import rank  # noqa: E402


def main() -> int:
    import autoopt_blackwell.plugin as blackwell

    # 1. A manager with the built-ins only, then the plugin module, under the name its entry point has.
    pm = PluginManager(autoload=False)
    pm.register(blackwell, name="blackwell")
    reset_plugin_manager(pm)  # make rank() use this manager

    # 2. What each plugin contributes (what `autoopt plugins` prints).
    for p in pm.describe():
        print(f"plugin {p['name']}: templates {p['templates']}, override hooks {p['hooks']}")

    # 3. Rank an fp8 GEMM on a B200: the plugin's template applies (tcgen05) and wins.
    op = OpSpec(kind="gemm", shape=(8192, 8192, 8192), dtype="fp8")
    b200 = rank(load_profile("b200"), op, top=1)
    best = b200.best
    print(f"b200: path {b200.path.path} ({b200.path.source}); best {best.config.template}: "
          f"{best.config.describe()} -> {best.predicted_us:.1f} us predicted")

    # 4. On an H100 (no tcgen05) the plugin's template does not apply; the built-ins answer.
    h100 = rank(load_profile("h100-sxm"), op, top=1)
    print(f"h100-sxm: path {h100.path.path} ({h100.path.source}); best {h100.best.config.template}")

    ok = best.config.template == "blackwell-tcgen05-gemm" and h100.best.config.template != best.config.template
    reset_plugin_manager()
    print("OK" if ok else "UNEXPECTED RESULT")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
