"""Fused-MoE configs in the runtime's own kernel: shipped vs default vs autoopt zero-shot vs tuned vs a grid (GPU).

One question: run through vLLM's own Triton ``fused_moe_kernel``, how fast are a layer's two expert GEMMs
(gate_up over the top-k slots, then down with the routing weights) under each config set?

- (a) vLLM's shipped config file for this (E, N, dtype, GPU), where one exists (the entry nearest M, as
  vLLM looks it up);
- (b) vLLM's default config, the one it falls back to (its ``get_default_config``);
- (c) autoopt's zero-shot config (``autoopt.search.moe.moe_config``: rank()'s predicted best, no timing);
- (d) autoopt tuned: the fastest of rank()'s top ``--tune-top`` configs, timed here;
- a grid of ``len(GRID)`` configs over the runtimes' config space: where the kernel can be (labelled
  "grid", not exhaustive; its size is in the JSON).

And autoopt's own kernel (``autoopt.backend.kernels.fused_moe``) on config (c), beside vLLM's on it.

vLLM's kernel is not in this repository: the harness reads ``fused_moe_kernel`` and ``get_default_config``
from a vLLM source file at run time (``--vllm-src DIR``: a folder holding vLLM's
``model_executor/layers/fused_moe/fused_moe.py`` as ``fused_moe.py`` and its ``configs/``), writes them
into a temporary module and imports it; the launch arguments follow vLLM's ``invoke_fused_moe_triton_kernel``
(the small-batch EM clip, the one-token-per-block path for sparse decode, SWAP_AB for FP8 on sm_90).

Every time is the median of CUDA-event timings of the two launches (align excluded: every set shares it; with
``--graph`` replayed from a CUDA graph of 32 calls cycling over up to 16 routings shifted by top-k experts, so the
host's launches are not timed and a small M's experts come from DRAM: back-to-back launches timed ~68-70 us for
every config at M = 1 on the H200, the host's two Triton launches),
reported only for a config whose output matched the float32 per-expert reference. The ratios come from a
final round (:func:`final_round`): the named sets and the grid's fastest configs timed again together, in
rotating order, so that no set is compared with the grid's luckiest single timing. Compiles run first in
``--jobs`` processes so the timed loop finds every kernel in Triton's cache::

    PYTHONPATH=. python benchmarks/moe_runtime_configs.py --vllm-src .vllm --out $OUT/moe_runtime_configs.json

``.vllm/`` (git-ignored; the device run carries it) from the wheel, on a machine with the package registry::

    pip download --no-deps vllm==0.33.0 -d /tmp/vllm && mkdir -p .vllm/configs && cd /tmp/vllm &&
    unzip -q vllm-*.whl 'vllm/model_executor/layers/fused_moe/*' && cd - &&
    cp /tmp/vllm/vllm/model_executor/layers/fused_moe/fused_moe.py .vllm/ &&
    cp /tmp/vllm/vllm/model_executor/layers/fused_moe/configs/*NVIDIA_H* .vllm/configs/
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib.util
import itertools
import json
import math
import random
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoopt._files import write_atomic

#: (label, E, N per shard, K hidden, top-k, dtype): real models' MoE layers (published config.json values)
CASES: tuple[tuple[str, int, int, int, int, str], ...] = (
    ("Mixtral-8x7B TP1", 8, 14336, 4096, 2, "bf16"),
    ("Mixtral-8x7B TP2", 8, 7168, 4096, 2, "bf16"),
    ("Mixtral-8x7B TP8", 8, 1792, 4096, 2, "bf16"),
    ("Qwen3-30B-A3B TP1", 128, 768, 2048, 8, "bf16"),
    ("Qwen3-235B-A22B TP8", 128, 192, 4096, 8, "bf16"),
    ("OLMoE-1B-7B TP1", 64, 1024, 2048, 8, "bf16"),
    ("DeepSeek-V2-Lite TP1", 64, 1408, 2048, 6, "bf16"),
    ("Mixtral-8x7B TP2 fp8", 8, 7168, 4096, 2, "fp8_w8a8"),
)
MS = (1, 16, 64, 256, 1024, 4096)
#: where and in what 16-bit type the harness runs: CUDA bf16; ``--interpret`` runs a tiny case under
#: TRITON_INTERPRET=1 on the CPU in fp16 (the interpreter's bf16 tl.dot is wrong) to check the harness itself
#: (``graph``: ``--graph`` timing)
RUN: dict[str, Any] = {"device": "cuda", "dtype": "bfloat16", "graph": False}
#: the grid: the runtimes' tuning axes, trimmed to what compiling every flavour in one device session allows
GRID = [dict(zip(("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages"),
                 (bm, bn, bk, g, w, st), strict=True))
        for bm, bn, bk, g, (w, st) in itertools.product((16, 32, 64, 128), (64, 128, 256), (64, 128), (1, 16),
                                                        ((4, 3), (4, 4), (8, 3)))]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-src", required=True, help="folder with vLLM's fused_moe.py and configs/")
    ap.add_argument("--cases", default="", help="comma list of case indices (default: all)")
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    ap.add_argument("--grid", type=int, default=len(GRID), help="grid configs kept (evenly spaced; default all)")
    ap.add_argument("--tune-top", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=14, help="compile processes (default %(default)s)")
    ap.add_argument("--budget-s", type=float, default=520.0)
    ap.add_argument("--graph", action="store_true",
                    help="time each config replayed from a CUDA graph, cycling over routings shifted by top-k experts "
                         "so a small M's experts come from DRAM (default: launches between CUDA events)")
    return ap.parse_args(argv)


# -- vLLM's kernel, loaded at run time -------------------------------------------------------------------------
_PRELUDE = '''
import triton
import triton.language as tl
from types import SimpleNamespace
envs = SimpleNamespace(VLLM_BATCH_INVARIANT=False)
current_platform = SimpleNamespace(is_rocm=lambda: False)
def next_power_of_2(n):
    return 1 << max(0, int(n) - 1).bit_length()
def should_moe_wna16_use_cuda(*args, **kwargs):
    return False
'''


@functools.cache
def load_vllm(src: Path) -> Any:
    """A module holding vLLM's ``write_zeros_to_output``, ``fused_moe_kernel`` and ``get_default_config``."""
    text = (src / "fused_moe.py").read_text()
    want = ("write_zeros_to_output", "fused_moe_kernel", "get_default_config")
    found = []
    for n in ast.parse(text).body:
        if isinstance(n, ast.FunctionDef) and n.name in want:
            jit = any(ast.unparse(d).startswith("triton.jit") for d in n.decorator_list)
            found.append(("@triton.jit\n" if jit else "") + (ast.get_source_segment(text, n) or ""))
    if len(found) != len(want):
        raise RuntimeError(f"{src}/fused_moe.py lacks one of {want}")
    path = Path(tempfile.mkdtemp()) / "vllm_fused_moe_kernel.py"
    path.write_text(_PRELUDE + "\n\n" + "\n\n\n".join(found) + "\n")
    spec = importlib.util.spec_from_file_location("vllm_fused_moe_kernel", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def shipped(src: Path, e: int, n: int, dtype: str, device_name: str) -> dict[int, dict[str, int]] | None:
    sel = "" if dtype in ("bf16", "fp16") else f",dtype={dtype}"
    dev = "NVIDIA_H200" if "H200" in device_name.split("_") else device_name
    path = src / "configs" / f"E={e},N={n},device_name={dev}{sel}.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data.pop("triton_version", None)
    return {int(k): v for k, v in data.items()}


def nearest(table: dict[int, dict[str, int]], m: int) -> dict[str, int]:
    return dict(table[min(table, key=lambda x: abs(x - m))])


# -- inputs and launches --------------------------------------------------------------------------------------
def make_case(e: int, n: int, k: int, topk: int, m: int, dtype: str, seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator(device=RUN["device"]).manual_seed(seed)
    x = torch.randn(m, k, device=RUN["device"], generator=g, dtype=getattr(torch, RUN["dtype"]))
    w13 = torch.randn(e, 2 * n, k, device=RUN["device"], generator=g, dtype=getattr(torch, RUN["dtype"])) / math.sqrt(k)
    w2 = torch.randn(e, k, n, device=RUN["device"], generator=g, dtype=getattr(torch, RUN["dtype"])) / math.sqrt(n)
    logits = torch.randn(m, e, device=RUN["device"], generator=g)
    tw, ids = torch.topk(torch.softmax(logits, -1), topk, dim=-1)
    tw = (tw / tw.sum(-1, keepdim=True)).float().contiguous()
    act = torch.randn(m * topk, n, device=RUN["device"], generator=g, dtype=getattr(torch, RUN["dtype"]))
    case = {"x": x, "w13": w13, "w2": w2, "tw": tw, "ids": ids.to(torch.int32).contiguous(), "act": act,
            "e": e, "n": n, "k": k, "topk": topk, "m": m, "dtype": dtype}
    if dtype == "fp8_w8a8":  # per-tensor: one scale per expert for W, one for A (vLLM's tensor-wise path)
        f8 = torch.float8_e4m3fn
        for name in ("w13", "w2"):
            w = case[name].float()
            s = w.abs().amax(dim=(1, 2)) / 448.0
            case[name + "_q"] = (w / s[:, None, None]).to(f8)
            case[name + "_s"] = s.contiguous()
        for name in ("x", "act"):
            s = case[name].float().abs().amax().reshape(1) / 448.0
            case[name + "_q"] = (case[name].float() / s).to(f8)
            case[name + "_s"] = s
    return case


def reference(c: dict[str, Any]) -> tuple[Any, Any]:
    """float32 per-expert (gate_up output per slot, down output per slot times its weight)."""
    import torch

    fp8 = c["dtype"] == "fp8_w8a8"
    x = (c["x_q"].float() * c["x_s"]) if fp8 else c["x"].float()
    act = (c["act_q"].float() * c["act_s"]) if fp8 else c["act"].float()
    w13 = (c["w13_q"].float() * c["w13_s"][:, None, None]) if fp8 else c["w13"].float()
    w2 = (c["w2_q"].float() * c["w2_s"][:, None, None]) if fp8 else c["w2"].float()
    ids = c["ids"].reshape(-1).long()
    rows = torch.arange(ids.numel(), device=RUN["device"]) // c["topk"]
    up = torch.empty(ids.numel(), w13.shape[1], device=RUN["device"])
    down = torch.empty(ids.numel(), w2.shape[1], device=RUN["device"])
    for ex in ids.unique().tolist():
        sel = (ids == ex).nonzero().flatten()
        up[sel] = x[rows[sel]] @ w13[ex].T
        down[sel] = (act[sel] @ w2[ex].T) * c["tw"].reshape(-1)[sel, None]
    return up, down


def _align(c: dict[str, Any], bm: int) -> tuple[Any, Any, Any]:
    from autoopt.backend.kernels.fused_moe import moe_align

    key = ("align", bm)
    if key not in c:
        c[key] = moe_align(c["ids"], bm, c["e"])
    return c[key]


def vllm_runner(mod: Any, c: dict[str, Any], cfg: dict[str, int], sm90: bool) -> Any:
    """Both GEMMs through vLLM's kernel as its invoke function launches them; returns (run, outputs)."""
    import torch
    import triton
    import triton.language as tl

    fp8 = c["dtype"] == "fp8_w8a8"
    m, topk, e = c["m"], c["topk"], c["e"]
    slots = m * topk
    naive = slots * 4 <= e  # vLLM: sparse decode skips the align, one (token, expert) pair a block
    bm = cfg["BLOCK_SIZE_M"]
    if naive:
        sorted_ids, expert_ids = None, c["ids"].reshape(-1)
        ntpp = torch.full((1,), slots * bm, dtype=torch.int32, device=RUN["device"])
        em = slots * bm
    else:
        sorted_ids, expert_ids, ntpp = _align(c, bm)
        em = sorted_ids.numel()
        if m < bm:
            em = min(em, slots * bm)
    swap = fp8 and sm90 and bm < 64 and cfg["BLOCK_SIZE_N"] >= 64
    out1 = torch.empty(m, topk, c["w13"].shape[1], device=RUN["device"], dtype=getattr(torch, RUN["dtype"]))
    out2 = torch.empty(m * topk, 1, c["w2"].shape[1], device=RUN["device"], dtype=getattr(torch, RUN["dtype"]))
    meta = {k: v for k, v in cfg.items() if k not in ("BLOCK_SIZE_K",)}

    def launch(a: Any, a_s: Any, b: Any, b_s: Any, out: Any, mul: bool, top_k: int, tw: Any) -> None:
        grid = (triton.cdiv(em, bm) * triton.cdiv(b.size(1), cfg["BLOCK_SIZE_N"]),)
        mod.fused_moe_kernel[grid](
            a, b, out, None, a_s, b_s, tw, sorted_ids, expert_ids, ntpp,
            b.size(1), b.size(2), em, slots,
            a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1), out.stride(1), out.stride(2),
            0, 0, b_s.stride(0) if b_s is not None else 0, 0, 0, 0, 0, 0, 0,
            MUL_ROUTED_WEIGHT=mul, top_k=top_k, compute_type=getattr(tl, RUN["dtype"]), use_fp8_w8a8=fp8,
            use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
            naive_block_assignment=sorted_ids is None, HAS_BIAS=False, BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"],
            SWAP_AB=swap, USE_TD=False, SPLIT_K=1, **meta)

    if fp8:
        args1 = (c["x_q"], c["x_s"], c["w13_q"], c["w13_s"])
        args2 = (c["act_q"], c["act_s"], c["w2_q"], c["w2_s"])
    else:
        args1 = (c["x"], None, c["w13"], None)
        args2 = (c["act"], None, c["w2"], None)

    def run() -> None:
        launch(*args1, out1, False, topk, c["tw"])
        launch(*args2, out2, True, 1, c["tw"])
    return run, (out1.view(slots, -1), out2.view(slots, -1))


def autoopt_runner(c: dict[str, Any], cfg: dict[str, int]) -> Any:
    """Both GEMMs through autoopt's kernel on the same inputs (align shared, outside the timing)."""
    import torch

    from autoopt.backend.kernels.fused_moe import fused_moe_gemm

    fp8 = c["dtype"] == "fp8_w8a8"
    slots = c["m"] * c["topk"]
    align = _align(c, cfg["BLOCK_SIZE_M"])
    out1 = torch.empty(slots, c["w13"].shape[1], device=RUN["device"], dtype=getattr(torch, RUN["dtype"]))
    out2 = torch.empty(slots, c["w2"].shape[1], device=RUN["device"], dtype=getattr(torch, RUN["dtype"]))
    if fp8:
        g1 = fused_moe_gemm(c["x_q"], c["w13_q"], out1, align, cfg, a_div=c["topk"], num_valid=slots,
                            w_scale=c["w13_s"], a_scale=c["x_s"].expand(c["m"]).contiguous())
        g2 = fused_moe_gemm(c["act_q"], c["w2_q"], out2, align, cfg, a_div=1, num_valid=slots, w_scale=c["w2_s"],
                            a_scale=c["act_s"].expand(slots).contiguous(), topk_weights=c["tw"])
    else:
        g1 = fused_moe_gemm(c["x"], c["w13"], out1, align, cfg, a_div=c["topk"], num_valid=slots)
        g2 = fused_moe_gemm(c["act"], c["w2"], out2, align, cfg, a_div=1, num_valid=slots, topk_weights=c["tw"])

    def run() -> None:
        g1()
        g2()
    return run, (out1, out2)


def rel(a: Any, b: Any) -> float:
    return float((a.float() - b).norm() / b.norm().clamp_min(1e-30))


def spin(ms: float = 50.0) -> None:
    """Keep the GPU busy for ``ms`` before a point is timed: after the CPU-side set-up between points its
    clocks may have dropped (run 2 timed the same M = 1 config at 68 and at 132 us within one run)."""
    import torch

    a = torch.randn(2048, 2048, device=RUN["device"], dtype=getattr(torch, RUN["dtype"]))
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < ms:
        for _ in range(8):
            a @ a
        torch.cuda.synchronize()


#: routings a graph-timed point cycles over at most (``--graph``), and the calls one captured graph holds
MAX_ROUTINGS, GRAPH_CALLS = 16, 32


def routings(c: dict[str, Any], l2_bytes: int) -> int:
    """How many routings a graph-timed point cycles over: enough that the experts they touch pass three L2s (a
    layer's experts come from DRAM in a running model, but one routing's few experts stay in L2 call after call),
    at most :data:`MAX_ROUTINGS` and one for each disjoint set of top-k experts."""
    per_expert = (c["w13"][0].numel() + c["w2"][0].numel()) * c["w13"].element_size()
    touched = int(c["ids"].unique().numel()) * per_expert
    if touched >= 3 * l2_bytes:
        return 1
    return max(1, min(MAX_ROUTINGS, c["e"] // c["topk"], math.ceil(3 * l2_bytes / max(touched, 1))))


def shifted_case(c: dict[str, Any], r: int) -> dict[str, Any]:
    """``c`` with every token routed ``r * topk`` experts further (mod E): the same tokens per expert, other
    experts' weights; the weights and activations shared, the cached align results dropped."""
    out = {k: v for k, v in c.items() if not (isinstance(k, tuple) and k[0] == "align")}
    out["ids"] = ((c["ids"] + r * c["topk"]) % c["e"]).contiguous()
    return out


def rotated(runner: Any, cases: list[dict[str, Any]]) -> tuple[Any, Any]:
    """``runner`` built on each case, called in turn: (the cycling run, the first case's outputs). Its first call
    runs the first case, whose outputs the check reads."""
    from autoopt.backend.runner import cycling

    built = [runner(cc) for cc in cases]
    return cycling([run for run, _ in built]), built[0][1]


#: GPU time one graph replay should hold, in us: the calls a graph captures are as many as reach it (at most
#: GRAPH_CALLS, at least 2). At M = 4096 a Mixtral call runs ~3 ms, and 32 calls a graph made one grid point
#: take over 230 s on the 2026-11-28 H200 run (moe_runtime_configs_graph_case0_partial.json, cut by the call limit)
GRAPH_TARGET_US = 2000.0


def graph_calls(once_us: float, least: int = 2) -> int:
    """Calls one captured graph holds for a call that took ``once_us`` (:data:`GRAPH_TARGET_US` of work), at least
    ``least`` (a point's routings: each replay passes every one)."""
    return max(2, least, min(GRAPH_CALLS, math.ceil(GRAPH_TARGET_US / max(once_us, 1e-3))))


def time_us_graph(run: Any, calls: int | None = None, samples: int = 5, least: int = 2) -> float:
    """Median us a call of ``run`` replayed from one CUDA graph of ``calls`` calls (default: :func:`graph_calls` of
    one event-timed call): the GPU's time with no host enqueue in it (a decode step in a graph runs so); timed
    between events, five replays."""
    import torch

    from autoopt.backend.runner import captured, replayed_us

    if calls is None:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        run()
        s.record()
        run()
        e.record()
        torch.cuda.synchronize()
        calls = graph_calls(s.elapsed_time(e) * 1e3, least)
    return replayed_us(captured(run, calls=calls), calls, samples)


def time_us(run: Any, floor_ms: float = 3.0) -> float:
    if RUN.get("graph"):
        return time_us_graph(run, least=RUN.get("routings", 2))
    import torch

    run()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    run()
    e.record()
    torch.cuda.synchronize()
    once = max(s.elapsed_time(e), 1e-3)
    reps = max(3, min(200, int(floor_ms / once)))
    samples = []
    for _ in range(5):
        s.record()
        for _ in range(reps):
            run()
        e.record()
        torch.cuda.synchronize()
        samples.append(s.elapsed_time(e) * 1e3 / reps)
    return statistics.median(samples)


def measure(make: Any, ref: tuple[Any, Any], tol: float) -> dict[str, Any]:
    """Time a runner only when both outputs match the reference."""
    try:
        run, outs = make()
        run()
        import torch

        torch.cuda.synchronize()
        err = max(rel(outs[0], ref[0]), rel(outs[1], ref[1]))
        if not err <= tol:
            return {"check": "failed", "rel_err": err}
        return {"check": "passed", "rel_err": round(err, 6), "measured_us": round(time_us(run), 3)}
    except Exception as exc:  # an invalid config (out of resources): recorded, not timed
        return {"check": "error", "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}


# -- compile ahead, in parallel ------------------------------------------------------------------------------------
def _compile_job(job: tuple[str, str, int, int, int, str, int, dict[str, int]]) -> str | None:
    """Run one config once on a small proxy of a point (same E, top-k, dtype and M: the same Triton
    specialization) in a worker, so Triton's disk cache holds its kernel when the timed loop asks."""
    kernel, src, e, topk, m, dtype, _, cfg = job
    try:
        import torch

        c = make_case(e, 128, 256, topk, m, dtype)
        if kernel == "vllm":
            sm90 = torch.cuda.get_device_capability() == (9, 0)
            vllm_runner(load_vllm(Path(src)), c, cfg, sm90)[0]()
        else:
            autoopt_runner(c, cfg)[0]()
        torch.cuda.synchronize()
        return None
    except Exception as exc:
        return f"{kernel} {cfg}: {type(exc).__name__}: {str(exc)[:120]}"


def precompile(args: argparse.Namespace, jobs: list[Any]) -> dict[str, Any]:
    import multiprocessing as mp

    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(args.jobs) as pool:
        errs = [r for r in pool.imap_unordered(_compile_job, jobs, chunksize=2) if r]
    return {"jobs": len(jobs), "errors": len(errs), "first_errors": errs[:3], "wall_s": round(time.time() - t0, 1)}


def _variant(e: int, topk: int, m: int) -> tuple[bool, bool, bool]:
    """What Triton specializes on beyond the config: the sparse-decode path, slots % 16, M below 16."""
    return m * topk * 4 <= e, (m * topk) % 16 == 0, m < 16


# -- one case -------------------------------------------------------------------------------------------------------
def zero_shot(profile: Any, e: int, n: int, k: int, topk: int, dtype: str, m: int, top: int) -> list[dict[str, int]]:
    from autoopt.kernels.ops import OpSpec
    from autoopt.search.moe import MOE_CONFIG_KEYS
    from autoopt.search.ranking import rank

    op = OpSpec(kind="fused_moe", shape=(m, e, topk, n, k), dtype="bf16",
                weight="fp8" if dtype == "fp8_w8a8" else None)
    cands = rank(profile.gpu, op, top=top, measured=False).candidates
    return [{key: int(cd.config.params[key]) for key in MOE_CONFIG_KEYS} for cd in cands]


def run_case(args: argparse.Namespace, mod: Any, profile: Any, idx: int, m: int, grid: list[dict[str, int]],
             device_name: str, t_end: float) -> dict[str, Any]:
    import torch

    label, e, n, k, topk, dtype = CASES[idx]
    c = make_case(e, n, k, topk, m, dtype)
    ref = reference(c)
    tol = 0.06 if dtype == "fp8_w8a8" else 0.02
    sm90 = torch.cuda.get_device_capability() == (9, 0)
    row: dict[str, Any] = {"case": label, "E": e, "N": n, "K": k, "topk": topk, "dtype": dtype, "M": m}
    cases = [c]
    if RUN.get("graph"):
        cases += [shifted_case(c, r) for r in range(1, routings(c, torch.cuda.get_device_properties(0).L2_cache_size))]
        row["routings"] = RUN["routings"] = len(cases)

    def vllm(cfg: dict[str, int]) -> Any:
        return rotated(lambda cc: vllm_runner(mod, cc, cfg, sm90), cases)

    table = shipped(Path(args.vllm_src), e, n, dtype, device_name)
    t0 = time.time()
    top = zero_shot(profile, e, n, k, topk, dtype, m, args.tune_top)
    row["zero_shot_s"] = round(time.time() - t0, 3)
    spin()
    sets = {"b_default": mod.get_default_config(m, e, n, k, topk, None if dtype == "bf16" else dtype, None),
            "c_zero_shot": top[0]}
    if table:
        sets["a_shipped"] = nearest(table, m)
    for name, cfg in sets.items():
        cfg = {kk: v for kk, v in cfg.items() if kk != "SPLIT_K"}
        row[name] = {"config": cfg, **measure(lambda cfg=cfg: vllm(cfg), ref, tol)}
    row["autoopt_kernel_on_c"] = measure(lambda: rotated(lambda cc: autoopt_runner(cc, top[0]), cases), ref, tol)
    tuned = []
    for cfg in top:
        r = measure(lambda cfg=cfg: vllm(cfg), ref, tol)
        if r.get("check") == "passed":
            tuned.append((r["measured_us"], cfg))
    if tuned:
        us, cfg = min(tuned, key=lambda t: t[0])
        row["d_tuned"] = {"config": cfg, "measured_us": us, "timed": len(tuned), "label": "measured (rank top-k)"}
    timed = 0
    for cfg in grid:
        if time.time() > t_end:
            row["grid_cut_short"] = True
            break
        r = measure(lambda cfg=cfg: vllm(cfg), ref, tol)
        # every grid timing kept (the cost model's calibration data): "BM/BN/BK/G/warps/stages" -> us
        row.setdefault("grid", {})["/".join(str(cfg[kk]) for kk in GRID[0])] = r.get("measured_us", r.get("check"))
        timed += r.get("check") == "passed"
    final_round(row, lambda cfg: measure(lambda: vllm(cfg), ref, tol), timed)
    torch.cuda.empty_cache()
    return row


#: grid configs (by first-pass time) re-timed with the named sets in the final round, and its passes
FINALISTS, FINAL_PASSES = 5, 3


def final_round(row: dict[str, Any], timed_us: Any, grid_timed: int, warm: Any = None) -> None:
    """The named sets (a-d) and the grid's fastest :data:`FINALISTS` configs timed again together,
    :data:`FINAL_PASSES` passes in a rotating order, each config's time the fastest of its passes; the
    search's best and every ratio come from this round alone. The grid's best of ~144 single timings is the
    luckiest sample of a noisy point (OLMoE at M = 1 timed its BM = 16 configs at ~70 or ~120 us, two modes
    with no pattern by config; run of 2026-11-27), so comparing a set's time with it favoured the grid."""
    grid = row.get("grid", {})
    ranked = sorted((us, key) for key, us in grid.items() if isinstance(us, (int, float)))
    names = [n for n in ("a_shipped", "b_default", "c_zero_shot", "d_tuned")
             if n in row and "measured_us" in row[n]]
    pool: dict[str, dict[str, int]] = {}
    for n in names:
        pool.setdefault("/".join(str(row[n]["config"][kk]) for kk in GRID[0]), row[n]["config"])
    for _, key in ranked[:FINALISTS]:
        pool.setdefault(key, dict(zip(GRID[0], map(int, key.split("/")), strict=True)))
    keys = list(pool)
    passes: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(FINAL_PASSES):
        (warm or spin)()
        for key in keys[i % len(keys):] + keys[:i % len(keys)]:
            r = timed_us(pool[key])
            if "measured_us" in r:
                passes[key].append(r["measured_us"])
    final = {k: min(v) for k, v in passes.items() if v}
    if not final:
        return
    best_key = min(final, key=lambda k: final[k])
    row["final_round"] = {"passes": FINAL_PASSES, "us": {k: [round(x, 3) for x in v] for k, v in passes.items()}}
    row["search_best"] = {"config": pool[best_key], "measured_us": round(final[best_key], 3), "grid_timed": grid_timed,
                          "label": "fastest of the final round (named sets + the grid's fastest)"}
    for n in names:
        key = "/".join(str(row[n]["config"][kk]) for kk in GRID[0])
        if key in final:
            row[n]["measured_us_first"] = row[n]["measured_us"]
            row[n]["measured_us"] = round(final[key], 3)
            row[n]["best_over_this"] = round(final[best_key] / final[key], 4)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def ratios(num: str, den: str) -> list[float]:
        return [r[den]["measured_us"] / r[num]["measured_us"] for r in rows
                if "measured_us" in r.get(num, {}) and "measured_us" in r.get(den, {})]

    def stats(x: list[float]) -> dict[str, Any]:
        return {"n": len(x), "geomean": round(math.exp(sum(map(math.log, x)) / len(x)), 4) if x else None,
                "min": round(min(x), 4) if x else None}
    out = {"c_vs_search_best (speed of c over best)": stats([1 / v for v in ratios("search_best", "c_zero_shot")]),
           "c_vs_a_shipped": stats(ratios("c_zero_shot", "a_shipped")),
           "c_vs_b_default": stats(ratios("c_zero_shot", "b_default")),
           "d_vs_search_best": stats([1 / v for v in ratios("search_best", "d_tuned")]),
           "autoopt_kernel_vs_vllm_kernel_on_c": stats(
               [r["c_zero_shot"]["measured_us"] / r["autoopt_kernel_on_c"]["measured_us"] for r in rows
                if "measured_us" in r.get("c_zero_shot", {}) and "measured_us" in r.get("autoopt_kernel_on_c", {})])}
    out["label"] = "ratios > 1: the first set is faster; geomean over (case, M) points, measured"
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("moe_runtime_configs: no CUDA device", file=sys.stderr)
        return 2
    from autoopt.hardware.detection import detect
    from benchmarks.quant_kernels import environment

    t0 = time.time()
    src = Path(args.vllm_src).resolve()
    mod = load_vllm(src)
    profile = detect()
    device_name = torch.cuda.get_device_name().replace(" ", "_")
    cases = [int(i) for i in args.cases.split(",") if i] or list(range(len(CASES)))
    ms = [int(x) for x in args.ms.split(",") if x]
    grid = GRID if args.grid >= len(GRID) else random.Random(0).sample(GRID, args.grid)
    RUN["graph"] = args.graph
    report: dict[str, Any] = {"env": environment(), "device_name": device_name, "vllm_kernel_source": str(src),
                              "grid_size": len(grid), "ms": ms, "rows": [],
                              "timing": ("CUDA graph replay, routings shifted by top-k experts (--graph)" if args.graph
                                         else "back-to-back launches between CUDA events")}
    out = Path(args.out)
    # every config a point will time, compiled ahead in parallel: one job per Triton specialization
    points = [(i, m) for i in cases for m in ms]
    tops = {p: zero_shot(profile, *CASES[p[0]][1:], p[1], args.tune_top) for p in points}
    jobs: dict[Any, Any] = {}
    for (i, m), top in tops.items():
        _, e, n, k, topk, dtype = CASES[i]
        table = shipped(src, e, n, dtype, device_name)
        extra = [mod.get_default_config(m, e, n, k, topk, None if dtype == "bf16" else dtype, None)]
        extra += [nearest(table, m)] if table else []
        for cfg in [*top, *extra, *grid]:
            cfg = {kk: int(v) for kk, v in cfg.items() if kk != "SPLIT_K"}
            key = ("vllm", _variant(e, topk, m), topk, dtype, tuple(sorted(cfg.items())))
            jobs.setdefault(key, ("vllm", str(src), e, topk, m, dtype, 0, cfg))
        key = ("autoopt", _variant(e, topk, m), topk, dtype, tuple(sorted(top[0].items())))
        jobs.setdefault(key, ("autoopt", str(src), e, topk, m, dtype, 0, top[0]))
    report["precompile"] = precompile(args, list(jobs.values()))
    print("precompile", report["precompile"], file=sys.stderr, flush=True)
    t_end = t0 + args.budget_s
    for i in cases:
        for m in ms:
            if time.time() > t_end:
                report.setdefault("skipped", []).append([CASES[i][0], m])
                continue
            try:
                row = run_case(args, mod, profile, i, m, grid, device_name, t_end)
            except Exception as exc:
                row = {"case": CASES[i][0], "M": m, "error": f"{type(exc).__name__}: {str(exc)[:300]}",
                       "traceback": traceback.format_exc()[-1500:]}
            report["rows"].append(row)
            report["summary"] = summarize(report["rows"])
            report["elapsed_s"] = round(time.time() - t0, 1)
            # written after each point, atomically, and marked incomplete until the last: a run stopped
            # from outside leaves the points it finished, labelled as a partial run
            report["complete"] = False
            write_atomic(out, json.dumps(report, indent=1) + "\n")
            brief = {k: row[k].get("measured_us") for k in ("a_shipped", "b_default", "c_zero_shot", "d_tuned",
                                                            "search_best") if isinstance(row.get(k), dict)}
            print(CASES[i][0], m, brief, file=sys.stderr, flush=True)
    report["complete"] = True
    write_atomic(out, json.dumps(report, indent=1) + "\n")
    print(json.dumps(report.get("summary"), indent=1), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
