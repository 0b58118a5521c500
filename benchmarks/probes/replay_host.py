"""Where autoopt's decode-graph call spends its host time inside ``generate()`` (issue 27).

``generate_host.json`` (H200, int4 Llama-3-8B, transformers 5.17) timed 0.47 ms of host time a token inside the
compiled call autoopt hands ``generate()`` (:class:`autoopt.nn.decode_graphs.DecodeGraphs`), while the GPU waits
(``generate()`` syncs every token); ``graph_launch.json`` timed a bare replay of the same step's graph at 12 us.
This probe splits the call, inside real ``generate()`` runs, into the signature (:class:`_Signature`), the input
copies and the graph's ``replay()``, all measured (perf_counter medians, us); then times ``replay()`` alone in
three loops after a sync: bare, after the input copies, and with a few small kernels between replays (as
``generate()``'s logits processing launches).

    PYTHONPATH=. python benchmarks/probes/replay_host.py --out $OUT/replay_host.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.probes.model_kit import no_cuda, optimized_llama

PROMPT = 128


def med_us(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1e6, 1) if xs else float("nan")


def instrumented(runner: Any, gen: Any, n: int) -> dict[str, Any]:
    """One ``n``-token generation with the runner's phases timed."""
    from autoopt.nn import decode_graphs

    times: dict[str, list[float]] = {"signature": [], "replay": [], "call": []}
    entry = next(iter(runner.graphs.values()))
    plain_replay, plain_sig, plain_call = entry.replay, decode_graphs._Signature, runner._replay

    def replay() -> None:
        t0 = time.perf_counter()
        plain_replay()
        times["replay"].append(time.perf_counter() - t0)

    class Signature(plain_sig):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any) -> None:
            t0 = time.perf_counter()
            super().__init__(*a)
            times["signature"].append(time.perf_counter() - t0)

    def call(kwargs: dict[str, Any]) -> Any:
        t0 = time.perf_counter()
        out = plain_call(kwargs)
        times["call"].append(time.perf_counter() - t0)
        return out

    entry.replay, decode_graphs._Signature, runner._replay = replay, Signature, call
    try:
        gen(n)
    finally:
        entry.replay, decode_graphs._Signature = plain_replay, plain_sig
        del runner._replay
    out = {f"{k}_us": med_us(v) for k, v in times.items()}
    out["copies_and_rest_us"] = round(out["call_us"] - out["signature_us"] - out["replay_us"], 1)
    out["calls"] = len(times["call"])
    return out


def replay_loops(entry: Any, reps: int = 50) -> dict[str, float]:
    """``replay()``'s host time after a sync: bare, after copying the static inputs onto themselves, and with a few
    small kernels (argmax, a cat, a compare) launched after each replay."""
    import torch

    from autoopt.nn.decode_graphs import _counters_kept

    caches = [ref() for ref in entry.caches]
    logits = torch.randn(1, 128256, device="cuda")
    ids = torch.zeros(1, 200, dtype=torch.long, device="cuda")

    def loop(copies: bool, tail: bool) -> float:
        xs = []
        for _ in range(reps):
            torch.cuda.synchronize()
            if copies:
                for s in entry.statics:
                    s.copy_(s.clone())
            with _counters_kept(caches):  # each replay advances the cache's counters: put back, or they overrun
                t0 = time.perf_counter()
                entry.replay()
                xs.append(time.perf_counter() - t0)
            if tail:
                tok = logits.argmax(-1)
                torch.cat([ids[:, 1:], tok[:, None]], dim=1)
                bool((tok == 0).any())
        torch.cuda.synchronize()
        return med_us(xs)

    return {"bare_us": loop(False, False), "after_copies_us": loop(True, False),
            "with_tail_kernels_us": loop(True, True)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--format", default="int4", choices=("bf16", "fp8", "int8", "int4"))
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    if no_cuda("replay_host", "generate()"):
        return 2
    import torch

    from autoopt.nn import decode_graphs
    from autoopt.nn.e2e import _Generation
    from benchmarks.quant_e2e import environment

    report: dict[str, Any] = {"env": environment(), "model": "llama-3-8b", "layers": args.layers,
                              "format": args.format, "label": "measured (host clock)"}
    model, _ = optimized_llama(args.format, args.layers)
    gen = _Generation(model, 1, PROMPT, args.new_tokens, "cuda", True)
    gen(args.new_tokens)
    gen(args.new_tokens)
    torch.cuda.synchronize()
    runner = decode_graphs.installed(model)[0]
    entry = next(iter(runner.graphs.values()))
    report["static_inputs"] = [{"shape": list(s.shape), "dtype": str(s.dtype), "device": str(s.device)}
                               for s in entry.statics]
    report["in_generate"] = [instrumented(runner, gen, args.new_tokens) for _ in range(3)]
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["in_generate"]), file=sys.stderr, flush=True)
    with torch.inference_mode():  # the cache's counters were made in inference mode
        report["replay_loops"] = replay_loops(entry)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "env"}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
