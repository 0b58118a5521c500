"""``autoopt calibrate``: refit the cost model's constants for this GPU from measured timings, or show or
remove the stored ones (see :mod:`autoopt.tuning.calibrate`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import FORMATS, UsageError, add_profile_arg, chosen_profile, emit, utc_minute

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.hardware.profile import GPUProfile


def register(sub: Subparsers) -> None:
    """Add ``calibrate``."""
    sp = sub.add_parser("calibrate", help="refit the cost model's constants for this GPU from measured timings")
    sp.add_argument("--from-store", dest="from_store", action="store_true",
                    help="fit on this device's measured rows in the results store")
    sp.add_argument("--sweep", action="store_true", help="time a short sweep of GEMM configs here (CUDA GPU), then fit")
    sp.add_argument("--show", action="store_true", help="print this device's stored constants")
    sp.add_argument("--reset", action="store_true", help="remove this device's stored constants")
    sp.add_argument("--seconds", type=float, help="time budget of --sweep in seconds (default 150, at most 150)")
    sp.add_argument("--names", help="comma-separated constants to fit (default: the committed calibration's nine)")
    sp.add_argument("--dry-run", dest="dry_run", action="store_true", help="fit and report, write nothing")
    sp.add_argument("--force", action="store_true", help="write the constants even if they rank no better")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``autoopt calibrate``: refit the cost model's constants for this GPU (see autoopt.tuning.calibrate)."""
    from autoopt.tuning import calibrate as cal

    t0 = time.perf_counter()
    _check(args)
    if args.sweep:
        cal.require_cuda()  # before detection: without a CUDA GPU, that is the one thing to say
    prof = chosen_profile(args.profile)
    gpu = prof.gpu
    if gpu is None:
        raise UsageError("calibrate: no GPU in this profile; pass --profile NAME|FILE (see `autoopt profiles`)")
    if args.show or args.reset:
        return _stored(args, gpu)
    names = [n.strip() for n in args.names.split(",") if n.strip()] if args.names else None
    if args.sweep:
        def progress(label: str, c: dict[str, Any]) -> None:
            print(f"autoopt: calibrate: {label}: {c['measured']} of {c['evaluated']} measured "
                  f"({c['planned']} planned) in {c['seconds']:.1f} s", file=sys.stderr)

        samples = cal.sweep_samples(gpu, seconds=args.seconds or cal.DEFAULT_SECONDS, on_shape=progress)
    else:
        samples = cal.store_samples(gpu)
    done = cal.calibrate_device(gpu, samples, profile=prof.name, names=names, save=not args.dry_run, force=args.force,
                                started=t0)
    data = done.to_dict()
    emit(data, args.format, _calibration_text(data))
    return 0


def _check(args: argparse.Namespace) -> None:
    """Refuse anything but exactly one action, --seconds without --sweep or out of range, and a fit with nowhere
    to keep it."""
    from autoopt.results import constants as stored
    from autoopt.tuning import calibrate as cal

    chosen = [args.from_store, args.sweep, args.show, args.reset]
    if sum(chosen) != 1:
        raise UsageError("calibrate: name exactly one of --from-store, --sweep, --show or --reset")
    if args.seconds is not None and (not args.sweep or not 0 < args.seconds <= cal.MAX_SECONDS):
        raise UsageError(f"calibrate: --seconds goes with --sweep and must be in (0, {cal.MAX_SECONDS:g}], "
                         f"got {args.seconds}")
    if (args.sweep or args.from_store) and not args.dry_run and stored.constants_dir() is None:
        raise UsageError("calibrate: the results cache is off (AUTOOPT_CACHE_DIR=off), so fitted constants cannot "
                         "be kept; pass --dry-run, or set AUTOOPT_CACHE_DIR to a folder")


def _stored(args: argparse.Namespace, gpu: GPUProfile) -> int:
    """--show (this device's stored constants) or --reset (remove them)."""
    from autoopt.results import constants as stored

    path = stored.path_for(gpu)
    if path is None:
        emit({"device": gpu.device_fingerprint, "gpu": gpu.name, "path": None, "stored": None}, args.format,
             "calibrated constants are off (AUTOOPT_CACHE_DIR=off): the ranking uses the defaults")
        return 0
    if args.reset:
        removed = stored.remove(gpu)
        emit({"device": gpu.device_fingerprint, "gpu": gpu.name, "removed": str(removed) if removed else None},
             args.format, f"removed {removed}: {gpu.name} ranks with the default constants again" if removed
             else f"no calibrated constants for {gpu.name} (device {gpu.device_fingerprint}) at {path}")
        return 0
    found = stored.load(gpu)
    data = {"device": gpu.device_fingerprint, "gpu": gpu.name, "path": str(path) if path else None,
            "stored": None if found is None else {**found.to_dict(), "changed": {
                k: {"default": a, "calibrated": b} for k, (a, b) in found.changed().items()}}}
    text = (f"no calibrated constants for {gpu.name} (device {gpu.device_fingerprint}) at {path}: "
            f"the ranking uses the defaults" if found is None else _constants_text(found, path))
    emit(data, args.format, text)
    return 0


def _constants_text(found: Any, path: Path) -> str:
    from autoopt.report import format_table

    rows = [(k, f"{a:.4g}", f"{b:.4g}", f"{b / a:.3f}x" if a else "-") for k, (a, b) in found.changed().items()]
    cal = found.calibration
    when = utc_minute(found.created_at) if found.created_at else "?"
    head = f"calibrated constants of {found.gpu} (device {found.device}), {path}, written {when} UTC"
    if cal.get("heldout_before") and cal.get("heldout_after"):
        b, a = cal["heldout_before"], cal["heldout_after"]
        head += (f"\nfrom {cal.get('samples', '?')} samples ({cal.get('source', '?')}): held-out median rho "
                 f"{b['median_spearman']:.3f} -> {a['median_spearman']:.3f}, geomean top-1 "
                 f"{b['geomean_top1']:.3f} -> {a['geomean_top1']:.3f}")
    return format_table(("constant", "default", "calibrated", "ratio"), rows, title=head)


def _calibration_text(data: dict[str, Any]) -> str:
    from autoopt.report import format_table

    d, s, c = data["device"], data["samples"], data["calibration"]
    b, a = c["heldout_before"], c["heldout_after"]
    src = (f"a {s['elapsed_s']:.0f} s sweep ({s['evaluated']} configs timed)" if s["source"] == "sweep"
           else f"the results store ({s['store']})")
    lines = [f"Calibration of {d['name']} (device {d['fingerprint']}, profile {d['profile']}) from {src}: "
             f"{c['n_samples']} samples over {c['n_shapes']} shapes; fit {len(c['names'])} constants on "
             f"{c['n_train']} in {c['fit_seconds']:.1f} s, scored on {c['n_heldout']} held-out", "",
             format_table(("held-out configs", "median rho", "geomean top-1", "min top-1"), [
                 ("before (default constants)", f"{b['median_spearman']:.3f}", f"{b['geomean_top1']:.3f}",
                  f"{b['min_top1']:.3f}"),
                 ("after (calibrated)", f"{a['median_spearman']:.3f}", f"{a['geomean_top1']:.3f}",
                  f"{a['min_top1']:.3f}")]), "",
             format_table(("shape", "held-out", "rho before", "rho after", "top-1 before", "top-1 after"),
                          [(r["shape"], r["n"], f"{r['spearman_before']:.3f}", f"{r['spearman_after']:.3f}",
                            f"{r['top1_before']:.3f}", f"{r['top1_after']:.3f}") for r in c["per_shape"]]), "",
             format_table(("constant", "default", "calibrated"),
                          [(k, f"{v['before']:.4g}", f"{v['after']:.4g}") for k, v in c["changed"].items()]), ""]
    if data["saved"]:
        lines.append(f"wrote {data['saved']}: rank() uses these constants on this device "
                     f"(`autoopt calibrate --reset` removes them)")
    else:
        lines.append(f"not written: {data['not_saved']}")
    return "\n".join(lines)
