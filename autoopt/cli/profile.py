"""``autoopt profile`` and ``autoopt profiles``: one machine's profile with what autoopt recommends on it,
and the list of known machines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import FORMATS, UsageError, add_profile_arg, chosen_profile, emit
from autoopt.errors import AutooptError

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.hardware.profile import HardwareProfile
    from autoopt.planning.recommendation import Recommendation


def register(sub: Subparsers) -> None:
    """Add ``profile`` and ``profiles``."""
    sp = sub.add_parser("profile", help="detect (or load) a machine profile and show its recommendations")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS, default="table")
    sp.add_argument("--save", metavar="FILE", help="also write the profile to FILE (.json or .yaml)")
    sp.add_argument("--measure", action="store_true", help="measure copy bandwidth and bf16 matmul rate on the GPU")
    sp.add_argument("--model", help="model for the plan section (default llama-3-8b)")
    sp.add_argument("--no-recommend", action="store_true", help="only the profile, no recommendations")
    sp.set_defaults(func=cmd_profile)

    sp = sub.add_parser("profiles", help="list known hardware profiles")
    sp.add_argument("--format", choices=FORMATS, default="table")
    sp.set_defaults(func=cmd_profiles)


def cmd_profile(args: argparse.Namespace) -> int:
    """``autoopt profile``: the profile, the quick suite's top configs and a model plan (unless --no-recommend)."""
    from autoopt import report

    prof = chosen_profile(args.profile, measure=args.measure)
    if args.save:
        _save(prof, Path(args.save))
    kernels = _suite_rankings(prof, "quick") if not args.no_recommend else []
    rec, rec_error = (None, None) if args.no_recommend else _plan(prof, args.model)
    data: dict[str, Any] = {"profile": prof.to_dict(), "kernels": kernels}
    if rec is not None:
        data["recommendation"] = rec.to_dict()
    if rec_error:
        data["recommendation_error"] = rec_error
    text = None
    if args.format == "table":
        text = report.profile_text(prof)
        if kernels:
            text += "\n\n" + _kernels_text(kernels)
        if rec is not None:
            text += "\n\n" + rec.explain()
        if rec_error:
            text += f"\n\nModel plan: not available: {rec_error}"
    emit(data, args.format, text)
    return 0


def _save(prof: HardwareProfile, path: Path) -> None:
    """``--save FILE``: the profile as YAML (.yaml, .yml) or JSON (anything else)."""
    saved = prof.to_yaml() if path.suffix in (".yaml", ".yml") else prof.to_json(indent=2) + "\n"
    try:
        path.write_text(saved)
    except OSError as exc:
        raise UsageError(f"cannot write --save file {str(path)!r}: {exc.strerror or exc}") from None
    print(f"saved profile to {path}", file=sys.stderr)


def _suite_rankings(prof: HardwareProfile, suite_name: str) -> list[dict[str, Any]]:
    """Top-1 predicted config for each op of a suite on the profile's first GPU."""
    gpu = prof.gpu
    if gpu is None:
        return []
    from autoopt.kernels.suite import suite
    from autoopt.search.ranking import rank

    out: list[dict[str, Any]] = []
    for label, op in suite(suite_name):
        try:
            r = rank(gpu, op, top=1)
        except AutooptError as exc:
            out.append({"op": label, "shape": list(op.shape), "kind": op.kind, "error": str(exc)})
            continue
        best = r.candidates[0].to_dict() if r.candidates else None
        out.append({"op": label, "kind": op.kind, "shape": list(op.shape), "dtype": op.dtype, "best": best})
    return out


def _kernels_text(kernels: list[dict[str, Any]]) -> str:
    from autoopt.report import format_table

    rows = []
    for k in kernels:
        b = k.get("best")
        if not b:
            rows.append((k["op"], "x".join(map(str, k["shape"])), k.get("error", "no valid config"), "", "", ""))
            continue
        cfg = " ".join(f"{a}={v}" for a, v in b["config"].items())
        rows.append((k["op"], "x".join(map(str, k["shape"])), f"{b['kernel']} {cfg}", b["path"],
                     f"{b['predicted_us']:.1f}", b["bound"]))
    return format_table(("op", "shape", "recommended config", "path", "predicted µs", "bound"), rows,
                        title="Recommended kernel configs (cost model, predicted, no timing)")


def _plan(prof: HardwareProfile, model: str | None) -> tuple[Recommendation | None, str | None]:
    """(plan, why there is none) for --model, else llama-3-8b where there is a GPU.

    Only an asked-for model's error is raised: a partly known machine still gets its profile shown.
    """
    if prof.gpu is None and not model:
        return None, None
    from autoopt.planning.recommendation import recommend

    try:
        return recommend(prof, model or "llama-3-8b"), None
    except AutooptError as exc:
        if model:  # the model was asked for: its error is the answer
            raise
        return None, str(exc)


def cmd_profiles(args: argparse.Namespace) -> int:
    """``autoopt profiles``: every known hardware profile, one line each."""
    from autoopt.api import known_profiles
    from autoopt.report import format_bytes, format_table

    devices = known_profiles()
    data = [{"name": d.name, "description": d.description, "count": d.count,
             "gpu": d.gpu.to_dict(), "path": d.path} for d in devices]
    rows = [(d.name, d.count, d.gpu.name, d.gpu.arch, d.gpu.sm_count, format_bytes(d.gpu.memory_total_bytes),
             d.gpu.mem_bandwidth_gbs, d.gpu.peak_tflops.get("bf16"), d.gpu.smem_per_block_optin_bytes)
            for d in devices]
    emit(data, args.format, format_table(
        ("name", "GPUs", "device", "arch", "SMs", "memory", "GB/s", "bf16 TFLOP/s", "SMEM opt-in B"), rows))
    return 0
