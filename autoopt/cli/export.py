"""``autoopt export moe-configs``: the fused-MoE kernel config files vLLM or SGLang read at start-up, for a
model (or explicit E/N/top-k/K) on a GPU, zero-shot from the cost model or measured with ``--tune``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import UsageError, add_fleet_args, fleet_wanted

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers
    from autoopt.hardware.profile import GPUProfile, HardwareProfile
    from autoopt.kernels.ops import OpSpec
    from autoopt.planning.moe_configs import MoeChooser
    from autoopt.runtimes.moe_configs import MoeEntry, MoeShard
    from autoopt.tuning.campaign import TunedOp

_EXPLICIT = ("experts", "intermediate", "topk", "hidden")


def register(sub: Subparsers) -> None:
    """Add ``export`` and its ``moe-configs``."""
    sp = sub.add_parser("export", help="files a serving runtime reads at start-up (fused-MoE kernel configs)")
    what = sp.add_subparsers(dest="what", metavar="WHAT", parser_class=type(sp))
    mc = what.add_parser("moe-configs", help="vLLM / SGLang fused-MoE config files for a MoE model on a GPU")
    mc.add_argument("--model", help="catalog name (mixtral-8x7b, ...) or a config.json path")
    mc.add_argument("--experts", type=int, help="routed experts (instead of --model)")
    mc.add_argument("--intermediate", type=int, help="one expert's intermediate size (instead of --model)")
    mc.add_argument("--topk", type=int, help="experts per token (instead of --model)")
    mc.add_argument("--hidden", type=int, help="hidden size (instead of --model)")
    mc.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    mc.add_argument("--ep", type=int, default=1, help="expert-parallel degree (default 1: off)")
    mc.add_argument("--runtime", choices=("vllm", "sglang"), default="vllm")
    mc.add_argument("--dtype", help="bf16, fp16, fp8_w8a8, fp8_w8a16, int8_w8a16, int4_w4a16, int8_w8a8 "
                    "(default: the model's 16-bit dtype, else bf16)")
    mc.add_argument("--block-shape", dest="block_shape", metavar="N,K",
                    help="block-quantized weights' [block_n, block_k], e.g. 128,128")
    mc.add_argument("--per-channel", dest="per_channel", action="store_true",
                    help="per-channel quantization (SGLang names its files for it)")
    mc.add_argument("--profile", metavar="NAME|FILE|detect",
                    help="the GPU the files are for (default: detect this machine's)")
    mc.add_argument("--out", required=True, metavar="DIR",
                    help="the folder VLLM_TUNED_CONFIG_FOLDER / SGLANG_MOE_CONFIG_DIR will point at")
    mc.add_argument("--triton-version", dest="triton_version", metavar="X.Y.Z",
                    help="the server's Triton (SGLang's folder; vLLM's file notes it); default: the installed one")
    mc.add_argument("--force", action="store_true", help="replace files there that autoopt did not write")
    mc.add_argument("--tune", action="store_true", help="measure each M on this GPU (or --gpus) instead of "
                    "predicting")
    mc.add_argument("--trials", type=int, default=8, help="with --tune: evaluations per M (1..10000, default 8)")
    mc.add_argument("--seconds", type=float, help="with --tune: time budget per M in seconds")
    mc.add_argument("--no-store", dest="no_store", action="store_true",
                    help="with --tune: do not read or write the results store")
    add_fleet_args(mc)
    mc.set_defaults(func=cmd_moe_configs)
    sp.set_defaults(func=_no_what(sp))


def _no_what(sp: argparse.ArgumentParser) -> Any:
    def handler(args: argparse.Namespace) -> int:
        raise UsageError("export: name what to export: moe-configs")

    return handler


def cmd_moe_configs(args: argparse.Namespace) -> int:
    """Write the files; their paths on stdout, one summary line per file on stderr."""
    from autoopt.planning.moe_configs import choose_all, rank_chooser

    _check(args)
    shards = _shards(args)
    if args.tune and fleet_wanted(args, "export moe-configs"):
        return _tune_fleet(args, shards)
    prof = _profile(args)
    gpu = _gpu(prof)
    chooser = rank_chooser(gpu)
    if args.tune:
        return _write(args, shards, gpu, prof.name, _local_entries(args, prof, chooser))
    return _write(args, shards, gpu, prof.name, lambda s: choose_all(chooser, s))


def _write(args: argparse.Namespace, shards: tuple[MoeShard, ...], gpu: GPUProfile, profile: str,
           entries_for: Callable[[MoeShard], Mapping[int, MoeEntry]]) -> int:
    from autoopt.planning.moe_configs import export_configs
    from autoopt.runtimes.moe_configs import ENV_VARS

    triton = args.triton_version or _installed_triton()
    written = export_configs(args.runtime, shards, gpu.name, args.out, entries_for=entries_for,
                             triton_version=triton, force=args.force,
                             provenance={"profile": profile, "model": args.model})
    for w in written:
        print(w.path)
        print(f"autoopt: {'replaced' if w.replaced else 'wrote'} {w.path.name}: {w.measured} measured, "
              f"{w.predicted} predicted entries for {gpu.name}" + (f", Triton {triton}" if triton else ""),
              file=sys.stderr)
    print(f"autoopt: start the server with {ENV_VARS[args.runtime]}={_abs(args.out)}", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> None:
    explicit = [k for k in _EXPLICIT if getattr(args, k) is not None]
    if args.model and explicit:
        raise UsageError(f"export moe-configs: give --model or --{' --'.join(_EXPLICIT)}, not both "
                         f"(--{explicit[0]} with --model)")
    if not args.model and len(explicit) != len(_EXPLICIT):
        missing = [f"--{k}" for k in _EXPLICIT if getattr(args, k) is None]
        raise UsageError(f"export moe-configs: give --model, or all of --experts --intermediate --topk --hidden "
                         f"(missing {' '.join(missing)})")
    if not args.tune and (args.gpus is not None or args.ray is not None):
        raise UsageError("export moe-configs: --gpus/--ray spread the measurements of --tune; add --tune")
    if args.trials < 1 or args.trials > 10_000:
        raise UsageError(f"export moe-configs: --trials must be in 1..10000, got {args.trials}")
    if args.seconds is not None and not 0 < args.seconds <= 86_400:
        raise UsageError(f"export moe-configs: --seconds must be in (0, 86400], got {args.seconds}")


def _block_shape(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    parts = text.strip().strip("[]").replace(" ", "").split(",")
    if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
        raise UsageError(f"export moe-configs: --block-shape takes two integers N,K like 128,128, got {text!r}")
    return int(parts[0]), int(parts[1])


def _shards(args: argparse.Namespace) -> tuple[MoeShard, ...]:
    from autoopt.runtimes.moe_configs import moe_shards

    bs = _block_shape(args.block_shape)
    if args.model:
        from autoopt.planning.catalog import parse_model
        from autoopt.planning.moe_configs import model_shards

        return model_shards(parse_model(args.model), args.runtime, tp=args.tp, ep=args.ep, dtype=args.dtype,
                            block_shape=bs, per_channel=args.per_channel)
    return moe_shards(args.runtime, experts=args.experts, intermediate=args.intermediate, hidden=args.hidden,
                      topk=args.topk, tp=args.tp, ep=args.ep, dtype=args.dtype or "bf16", block_shape=bs,
                      per_channel=args.per_channel)


def _profile(args: argparse.Namespace) -> HardwareProfile:
    from autoopt.cli._common import chosen_profile

    return chosen_profile(None if args.profile in (None, "detect") else args.profile)


def _gpu(prof: HardwareProfile) -> GPUProfile:
    if prof.gpu is None:
        raise UsageError(f"export moe-configs: profile {prof.name!r} has no GPU; name one with --profile "
                         "(e.g. h100-sxm)")
    return prof.gpu


def _installed_triton() -> str | None:
    """The installed Triton's version, read from its metadata (never importing it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("triton")
    except PackageNotFoundError:
        return None


def _abs(path: str) -> str:
    from pathlib import Path

    return str(Path(path).expanduser().resolve())


def _local_entries(args: argparse.Namespace, prof: HardwareProfile, chooser: MoeChooser
                   ) -> Callable[[MoeShard], Mapping[int, MoeEntry]]:
    """Entries measured on this GPU with the tuner (each M's trials stored as ``autoopt tune`` stores them)."""
    from autoopt.tuning import campaign
    from autoopt.tuning.moe_configs import tuned_entries

    def measure(ops: list[tuple[str, OpSpec]]) -> Sequence[TunedOp]:
        return campaign.tune_ops(prof, ops, budget_trials=args.trials, budget_s=args.seconds,
                                 use_store=not args.no_store)

    return lambda s: tuned_entries(s, measure, chooser)


def _tune_fleet(args: argparse.Namespace, shards: tuple[MoeShard, ...]) -> int:
    """``--tune --gpus|--ray``: the same measurements spread over the fleet's GPUs, of one kind (a config
    file names one device)."""
    from autoopt.fleet import jobs
    from autoopt.planning.moe_configs import rank_chooser
    from autoopt.tuning.moe_configs import tuned_entries

    t0 = time.perf_counter()
    with jobs.open_fleet(mode="tune", gpus=args.gpus, ray=args.ray, profile=args.profile) as fleet:
        kinds = fleet.kinds()
        if len(kinds) != 1:
            raise UsageError(f"export moe-configs: a config file names one GPU; the fleet has {len(kinds)} kinds "
                             f"({', '.join(d[0].gpu.name for d in kinds.values())}); pick one kind with --gpus")
        device = next(iter(kinds.values()))[0]
        chooser = rank_chooser(device.gpu)

        def measure(ops: list[tuple[str, OpSpec]]) -> Sequence[TunedOp]:
            done = jobs.tune(fleet, ops, budget_trials=args.trials, budget_s=args.seconds,
                             use_store=not args.no_store)
            print(f"autoopt: fleet: {fleet.pool.stats.utilisation(time.perf_counter() - t0)}", file=sys.stderr)
            return done

        return _write(args, shards, device.gpu, device.profile or device.gpu.name,
                      lambda s: tuned_entries(s, measure, chooser))
