"""The ``autoopt`` command line: a thin layer over the Python API.

Data goes to stdout, diagnostics to stderr. Bad input of any kind (an unknown
profile, a malformed shape, an unreadable file) is one line on stderr and exit
status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from autoopt.errors import AutooptError

log = logging.getLogger(__name__)

EXIT_USAGE = 2
FORMATS = ("table", "json", "yaml")


class UsageError(Exception):
    """Bad command-line input that argparse itself would report."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage too)
        sub = self.prog.removeprefix("autoopt").strip()
        raise UsageError(f"{sub}: {message}" if sub else message)


def _emit(data: Any, fmt: str, text: str | None = None) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    elif fmt == "yaml":
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        sys.stdout.write((text if text is not None else json.dumps(data, indent=2)) + "\n")


def _profile(arg: str | None, *, measure: bool = False):
    """The profile named by --profile (name or file), else the detected machine."""
    if arg:
        from autoopt.api import load_profile

        return load_profile(arg)
    from autoopt.hardware.detection import detect

    return detect(measure=measure)


# -- commands ----------------------------------------------------------------------------

def cmd_profile(args: argparse.Namespace) -> int:
    from autoopt import report

    prof = _profile(args.profile, measure=args.measure)
    if args.save:
        path = Path(args.save)
        text = prof.to_yaml() if path.suffix in (".yaml", ".yml") else prof.to_json(indent=2) + "\n"
        try:
            path.write_text(text)
        except OSError as exc:
            raise UsageError(f"cannot write --save file {str(path)!r}: {exc.strerror or exc}") from None
        print(f"saved profile to {path}", file=sys.stderr)
    kernels = _suite_rankings(prof, "quick") if not args.no_recommend else []
    rec, rec_error = None, None
    if not args.no_recommend:
        try:
            rec = _default_recommendation(prof, args.model)
        except AutooptError as exc:
            if args.model:  # the model was asked for: its error is the answer
                raise
            rec_error = str(exc)  # a partly known machine still gets its profile shown
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
    _emit(data, args.format, text)
    return 0


def _suite_rankings(prof: Any, suite_name: str) -> list[dict[str, Any]]:
    """Top-1 predicted config for each op of a suite on the profile's first GPU."""
    gpu = prof.gpu
    if gpu is None:
        return []
    from autoopt.kernels.suite import suite
    from autoopt.search.ranking import rank

    out = []
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


def _default_recommendation(prof: Any, model: str | None):
    if prof.gpu is None and not model:
        return None
    from autoopt.planning.recommendation import recommend

    return recommend(prof, model or "llama-3-8b")


def cmd_profiles(args: argparse.Namespace) -> int:
    from autoopt.api import known_profiles
    from autoopt.report import format_bytes, format_table

    devices = known_profiles()
    data = [{"name": d.name, "description": d.description, "count": d.count,
             "gpu": d.gpu.to_dict(), "path": d.path} for d in devices]
    rows = [(d.name, d.count, d.gpu.name, d.gpu.arch, d.gpu.sm_count, format_bytes(d.gpu.memory_total_bytes),
             d.gpu.mem_bandwidth_gbs, d.gpu.peak_tflops.get("bf16"), d.gpu.smem_per_block_optin_bytes)
            for d in devices]
    _emit(data, args.format, format_table(
        ("name", "GPUs", "device", "arch", "SMs", "memory", "GB/s", "bf16 TFLOP/s", "SMEM opt-in B"), rows))
    return 0


def cmd_kernel(args: argparse.Namespace) -> int:
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.report import format_table
    from autoopt.search.ranking import rank

    prof = _profile(args.profile)
    if prof.gpu is None:
        raise UsageError("no GPU in this profile; pass --profile NAME|FILE (see `autoopt profiles`)")
    op = OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype, layout=args.layout)
    r = rank(prof.gpu, op, top=args.top, force=args.force)
    data = r.to_dict()
    rows = [(i + 1, c.config.kernel, c.config.describe(), c.config.path, f"{c.predicted_us:.2f}", c.bound,
             f"{c.roofline_pct:.0f}%", c.reason) for i, c in enumerate(r.candidates)]
    text = format_table(("#", "kernel", "config", "path", "predicted µs", "bound", "roofline", "why"), rows,
                        title=f"{op.label()} on {prof.gpu.name} ({prof.name}): top {len(rows)} "
                              f"of {data.get('considered', '?')} configs (predicted by the cost model)")
    _emit(data, args.format, text)
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    from autoopt.plugins.manager import list_plugins
    from autoopt.report import format_table

    plugins = list_plugins()
    rows = [(p["name"], p.get("version") or "-", ", ".join(p.get("templates", [])) or "-",
             ", ".join(p.get("hooks", [])) or "-", "; ".join(p.get("problems", [])) or "ok") for p in plugins]
    _emit({"plugins": plugins}, args.format,
          format_table(("plugin", "version", "templates", "hooks", "status"), rows))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from autoopt.backend import bench
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.kernels.suite import suite
    from autoopt.search.ranking import predict_config, validate_config

    prof = _profile(args.profile)
    gpu = prof.gpu
    if gpu is None:
        raise UsageError("no GPU in this profile; pass --profile NAME|FILE for predictions (see `autoopt profiles`)")
    if args.op:
        if not args.shape:
            raise UsageError("--op needs --shape")
        ops = [OpSpec(kind=args.op.lower(), shape=parse_shape(args.shape), dtype=args.dtype)]
    else:
        ops = [op for _, op in suite(args.suite or "llm", args.dtype)]
    for target in (args.out, args.plot):
        if target and not Path(target).resolve().parent.is_dir():
            raise UsageError(f"cannot write {target!r}: its folder does not exist")
    rows = bench.run_bench(bench.recommended_cases(gpu, ops), gpu, progress=args.format == "table",
                           validate=lambda op, cfg: validate_config(gpu, op, cfg),
                           predict=lambda op, cfg: predict_config(gpu, op, cfg).us)
    versions = next((r.result.versions for r in rows if r.result.versions), {})
    data = {"profile": prof.name, "gpu": gpu.name, "versions": versions, "rows": [r.to_dict() for r in rows]}
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    if args.plot:
        if not any(r.label == "measured" for r in rows):
            print("autoopt: no measured rows (no GPU here): --plot skipped", file=sys.stderr)
        else:
            from autoopt.backend.plot import roofline_png

            roofline_png(rows, gpu, args.plot)
            print(f"wrote {args.plot}", file=sys.stderr)
    _emit(data, args.format, bench.format_table(rows))
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    from autoopt.planning.recommendation import recommend

    prof = _profile(args.profile)
    kwargs: dict[str, Any] = {"batch": args.batch, "phase": args.phase, "preference": args.preference}
    for key in ("context", "prompt_len", "gen_len", "weight_dtype", "kv_dtype"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    rec = recommend(prof, args.model, **kwargs)
    _emit(rec.to_dict(), args.format, rec.explain())
    return 0


# -- parser ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="autoopt", description="Hardware-aware kernel and model-plan recommendations.")
    p.add_argument("-v", "--verbose", action="count", default=0, help="log diagnostics to stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def add_profile_arg(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--profile", metavar="NAME|FILE",
                        help="a known profile (see `autoopt profiles`) or a saved profile file; default: detect")

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

    sp = sub.add_parser("kernel", help="rank kernel configs for one op (cost model, no timing)")
    sp.add_argument("op", metavar="OP", help="gemm, gemv, silu_mul, add, rmsnorm, layernorm, softmax")
    sp.add_argument("--shape", required=True, help="e.g. 256,6144,4096 (M,N,K) or 4096,4096 (rows,N)")
    sp.add_argument("--dtype", default="bf16")
    sp.add_argument("--layout", default="nk", choices=("nk", "kn"))
    sp.add_argument("--top", type=int, default=5)
    sp.add_argument("--force", choices=("single", "looped"), help="force the norm/softmax approach")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_kernel)

    sp = sub.add_parser("plugins", help="list installed plugins and what each contributes")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_plugins)

    sp = sub.add_parser("bench", help="compile, check and time recommended configs against torch")
    sp.add_argument("--suite", default=None, help="op suite (llm); default llm unless --op is given")
    sp.add_argument("--op", help="one op kind instead of a suite")
    sp.add_argument("--shape", help="shape for --op")
    sp.add_argument("--dtype", default="bf16")
    add_profile_arg(sp)
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.add_argument("--out", metavar="FILE", help="write the results as JSON")
    sp.add_argument("--plot", metavar="FILE", help="write a roofline chart (PNG)")
    sp.set_defaults(func=cmd_bench)

    sp = sub.add_parser("recommend", help="whole-model plan: kernels, quant format, memory, split")
    sp.add_argument("--model", required=True, help="catalog name (llama-3-8b, ...) or a config.json path")
    add_profile_arg(sp)
    sp.add_argument("--batch", type=int, default=1)
    sp.add_argument("--context", type=int)
    sp.add_argument("--prompt-len", dest="prompt_len", type=int)
    sp.add_argument("--gen-len", dest="gen_len", type=int)
    sp.add_argument("--phase", choices=("prefill", "decode", "both"), default="both")
    sp.add_argument("--weight-dtype", dest="weight_dtype")
    sp.add_argument("--kv-dtype", dest="kv_dtype")
    sp.add_argument("--preference", choices=("speed", "balanced", "quality"), default="balanced")
    sp.add_argument("--format", choices=FORMATS[:2], default="table")
    sp.set_defaults(func=cmd_recommend)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2), stream=sys.stderr,
                            format="autoopt: %(levelname)s: %(name)s: %(message)s")
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.func(args) or 0)
    except (UsageError, AutooptError) as exc:
        print(f"autoopt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        print("autoopt: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line, unless asked for the traceback
        if os.environ.get("AUTOOPT_DEBUG"):
            raise
        print(f"autoopt: internal error: {type(exc).__name__}: {exc} (set AUTOOPT_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
