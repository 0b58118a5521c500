"""``autoopt kernel``: the cost model's ranking of kernel configs for one op (predicted, no timing)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from autoopt.cli._common import FORMATS, UsageError, add_profile_arg, chosen_profile, emit

if TYPE_CHECKING:
    from autoopt.cli._common import Subparsers


def register(sub: Subparsers) -> None:
    """Add ``kernel``."""
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


def cmd_kernel(args: argparse.Namespace) -> int:
    """``autoopt kernel OP --shape S``: the top configs of rank() on the profile's first GPU."""
    from autoopt.kernels.ops import OpSpec, parse_shape
    from autoopt.report import format_table
    from autoopt.search.ranking import rank

    prof = chosen_profile(args.profile)
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
    emit(data, args.format, text)
    return 0
