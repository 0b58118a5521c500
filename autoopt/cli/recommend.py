"""``autoopt recommend``: a whole-model plan (kernels, quant format, memory, split), optionally in a serving
runtime's rules and with that runtime's own arguments."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from autoopt.cli._common import FORMATS, UsageError, add_profile_arg, chosen_profile, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers

#: options passed on to recommend() only when given (its own defaults apply otherwise)
_OPTIONAL = ("context", "prompt_len", "gen_len", "weight_dtype", "kv_dtype", "runtime", "tensor_parallel",
             "pipeline_parallel")


def register(sub: Subparsers) -> None:
    """Add ``recommend``."""
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
    sp.add_argument("--preference", choices=("speed", "balanced", "quality", "fastest"), default="balanced",
                    help="weight-format rule; fastest: every format that fits priced, the fastest kept")
    sp.add_argument("--runtime", help="plan for this serving runtime's rules: vllm, sglang, llama.cpp, "
                    "transformers, autoopt (or a plugin's)")
    sp.add_argument("--tensor-parallel", dest="tensor_parallel", type=int, help="fix the tensor-parallel degree")
    sp.add_argument("--pipeline-parallel", dest="pipeline_parallel", type=int,
                    help="fix the pipeline-parallel degree")
    sp.add_argument("--cuda-graphs", dest="cuda_graphs", action="store_true",
                    help="price decode steps as replayed from a CUDA graph (about 1 us a kernel, not a launch)")
    sp.add_argument("--moe-configs", dest="moe_configs", metavar="DIR",
                    help="with --runtime vllm/sglang and a MoE model: the folder `autoopt export moe-configs` "
                    "wrote (exported as VLLM_TUNED_CONFIG_FOLDER / SGLANG_MOE_CONFIG_DIR)")
    sp.add_argument("--model-id", dest="model_id", help="the checkpoint name the runtime loads (with --runtime)")
    sp.add_argument("--format", choices=(*FORMATS[:2], "args"), default="table",
                    help="args: the runtime's own arguments, ready to paste (needs --runtime)")
    sp.set_defaults(func=cmd_recommend)


def cmd_recommend(args: argparse.Namespace) -> int:
    """``autoopt recommend --model M``: the plan explained (or as data), with --runtime its arguments too."""
    from autoopt.planning.recommendation import recommend

    prof = chosen_profile(args.profile)
    if args.format == "args" and args.runtime is None:
        raise UsageError("recommend: --format args needs --runtime (vllm, sglang, llama.cpp, transformers, "
                         "autoopt)")
    rec = recommend(prof, args.model, **_options(args))
    if args.format == "args":
        from autoopt.runtimes.export import export, format_args

        exported = export(rec.to_dict(), args.runtime, model_id=args.model_id, profile=prof.to_dict(),
                          moe_configs=args.moe_configs)
        print(format_args(exported))
        if "launch" in exported:  # data on stdout, how to start it on stderr
            print(f"autoopt: run it in one process a GPU: {exported['launch']}", file=sys.stderr)
        return 0
    data = rec.to_dict()
    text = rec.explain()
    if args.runtime is not None and rec.fits:
        from autoopt.runtimes.export import export, format_args

        data["runtime_args"] = export(data, args.runtime, model_id=args.model_id, profile=prof.to_dict(),
                                     moe_configs=args.moe_configs)
        text += f"\nRun it with {args.runtime}:\n  {format_args(data['runtime_args'])}"
        if "launch" in data["runtime_args"]:
            text += f"\n  in one process a GPU: {data['runtime_args']['launch']}"
    emit(data, args.format, text)
    return 0


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """recommend()'s keyword arguments from the command line."""
    options: dict[str, Any] = {"batch": args.batch, "phase": args.phase, "preference": args.preference,
                               "compare_wfc": True,  # an engineer reads the search beside the DP
                               "cuda_graphs": args.cuda_graphs}
    for key in _OPTIONAL:
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    return options
