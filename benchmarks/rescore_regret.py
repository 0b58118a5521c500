"""Re-score a committed ``autoopt check regret`` run with today's model: same measurements, new picks.

A regret run's measured rows (each option built, optimised and timed on the GPU) do not depend on the
model; its predictions and recommend()'s pick do. This reads a run's JSON, predicts every measured option
again with :func:`autoopt.regret.run.predicted_ms` on the profile of the GPU it ran on, takes
:func:`autoopt.regret.run.recommended`'s pick, and writes the table again, labelled: measurements from
the file, predictions and picks from this commit. Nothing runs on a GPU. A kernel change since the run
is not re-measured (the note says so); only a GPU run settles what the new picks measure.

    PYTHONPATH=. python benchmarks/rescore_regret.py benchmarks/results/h100/regret_1gpu_layers8.json \
        --profile h100-sxm --out benchmarks/results/h100/regret_1gpu_layers8_rescored.json

``--profile`` is a library profile's name or a HardwareProfile JSON file (``autoopt profile --format json``):
a multi-GPU run needs its host's GPUs and links, which a library profile (one GPU) does not hold. A run
that recorded its profile (``hardware``) is re-scored on it when ``--profile run`` is given.
"""

from __future__ import annotations

import argparse
import json
import math
import stat
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="a regret run's JSON (autoopt check regret --out)")
    ap.add_argument("--profile", required=True, help="the profile it was measured on: a library name, a "
                    "HardwareProfile JSON file, or 'run' (the profile the run recorded)")
    ap.add_argument("--out", required=True, help="the re-scored JSON to write")
    return ap.parse_args(argv)


def measured_ms(row: dict[str, Any]) -> float:
    """A row's measured step: the least of its timed blocks where the run kept them (the harness's statistic
    since 2026-11-29, :data:`autoopt.nn.e2e.EAGER_BLOCKS`; runs before it reported their median), else the
    run's own ``measured_ms``."""
    blocks = row.get("measured_blocks_ms")
    return float(min(blocks)) if blocks else float(row["measured_ms"])


def rescore(data: dict[str, Any], profile: str) -> dict[str, Any]:
    """The run's workloads with predictions, pick and regret from this commit's model."""
    from autoopt.regret.options import Option
    from autoopt.regret.run import model_spec, predicted_ms, recommended

    hw = hardware(profile, data)
    spec = model_spec(data["model"], data["layers"])
    workloads, logs, graphed = [], [], []
    for w in data["workloads"]:
        measured = {Option.from_dict(r["option"]): measured_ms(r) for r in w["options"]
                    if r["measured_ms"] is not None}
        predicted = {o: predicted_ms(hw, spec, o) for o in measured}
        pick, reason = recommended(hw, spec, w["batch"], predicted)
        best = min(measured, key=lambda o: measured[o])
        regret = measured[pick] / measured[best] - 1 if pick in measured else None
        rows = []
        for o, ms in measured.items():
            ratio = predicted[o] / ms
            logs.append(math.log(ratio))
            if o.cuda_graphs:
                graphed.append(math.log(ratio))
            rows.append({"label": o.label, "predicted_ms": round(predicted[o], 4), "measured_ms": ms,
                         "predicted_over_measured": round(ratio, 4)})
        workloads.append({"batch": w["batch"], "recommended": pick.label if pick else None,
                          "recommended_reason": reason, "measured_best": best.label,
                          "regret": None if regret is None else round(regret, 4),
                          "regret_in_the_run": w.get("regret"), "options": rows})
    regrets = [w["regret"] for w in workloads if w["regret"] is not None]
    return {"label": "re-scored: measured_ms from the run (an uncompiled row's least block where it kept its "
                     "blocks), predicted_ms / recommended from this commit's model",
            "run": {k: data.get(k) for k in ("model", "layers", "device", "env", "elapsed_s")},
            "profile": profile, "commit": _commit(),
            "regret": {"n": len(regrets), "max": max(regrets) if regrets else None,
                       "median": statistics.median(regrets) if regrets else None},
            "prediction": {"n": len(logs), "median_abs_ln": round(statistics.median(abs(x) for x in logs), 4)},
            "prediction_graphed": {"n": len(graphed),
                                   "median_abs_ln": round(statistics.median(abs(x) for x in graphed), 4),
                                   "worst_ratio": round(math.exp(max(graphed, key=abs)), 4)},
            "note": "kernels changed since the run are not re-measured: a pick whose kernels changed measures "
                    "what the run measured, not what it would measure now",
            "workloads": workloads}


def _commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip() or None


#: a regret run's JSON is tens of KB; anything past this is not one
MAX_RUN_BYTES = 16 << 20
def hardware(profile: str, data: dict[str, Any]) -> Any:
    """The HardwareProfile to predict on: the run's recorded one (``run``), else a library name's or a saved
    profile file's (:func:`autoopt.hardware.library.load_profile` checks the file)."""
    from autoopt.hardware.library import load_profile
    from autoopt.hardware.profile import HardwareProfile

    if profile == "run":
        if not isinstance(data.get("hardware"), dict):
            raise ValueError("--profile run: this run recorded no profile; name one or give its JSON file")
        return HardwareProfile.from_dict(data["hardware"])
    return load_profile(Path(profile) if Path(profile).exists() else profile)


def checked_json(path: Path, limit: int, what: str) -> Any:
    """``path``'s JSON, checked first: a regular file of at most ``limit`` bytes. ValueError (one line) otherwise."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror})") from exc
    if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
        raise ValueError(f"{path}: expected a regular file of at most {limit >> 20} MiB ({what})")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from exc


def load_run(path: Path) -> dict[str, Any]:
    """A regret run's JSON, checked first: a regular file of sane size holding an object with ``model``,
    ``layers`` and a ``workloads`` list. ValueError (one line, naming the file) otherwise."""
    data = checked_json(path, MAX_RUN_BYTES, "a regret run's JSON")
    if not isinstance(data, dict) or not isinstance(data.get("workloads"), list) or "model" not in data:
        raise ValueError(f"{path}: not a regret run (expected the JSON `autoopt check regret --out` writes)")
    return data


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        data = load_run(Path(args.run))
    except ValueError as exc:
        print(f"rescore_regret: {exc}", file=sys.stderr)
        return 2
    try:
        out = rescore(data, args.profile)
    except (ValueError, LookupError) as exc:
        print(f"rescore_regret: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    for w in out["workloads"]:
        print(f"batch {w['batch']}: recommended {w['recommended']}, measured best {w['measured_best']}, "
              f"regret {w['regret']} (in the run: {w['regret_in_the_run']})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
