"""Run a transformers model on autoopt's kernels: optimize, generate, read the report, restore.

1. Build a small causal LM from its config (random weights, nothing downloaded): Llama, Qwen2,
   Mistral or Gemma.
2. ``autoopt.optimize(model)``: every nn.Linear, RMSNorm and gated MLP is swapped for a module
   that runs autoopt's kernels (each kind checked once against the original on a sample input).
3. ``model.generate()`` as usual; the greedy tokens are compared with the original model's.
4. Print the report (what was replaced, what was not and why, the kernel configs chosen), then
   ``autoopt.restore(model)`` puts the original modules back.

On a CUDA GPU the Triton kernels run compiled. Without one, ``--interpret`` runs them in Triton's
CPU interpreter (slow, but every kernel for real); otherwise the ops fall back to torch. The
report's ``kernels:`` label says which one ran.

    PYTHONPATH=. python examples/optimize_hf_model.py --family gemma --interpret
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
}
#: a small config: the real code paths, shapes a CPU interpreter gets through in seconds.
SMALL = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128, "max_position_embeddings": 128}


def build(family: str, dtype: str, device: str) -> Any:
    import torch
    import transformers

    config_cls, model_cls = FAMILIES[family]
    config = getattr(transformers, config_cls)(**SMALL)
    torch.manual_seed(0)
    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    with torch.device(device):
        model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # off the init values (norm weights all 1, or all 0 in Gemma)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.to(torch_dtype)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--family", choices=sorted(FAMILIES), default="llama")
    ap.add_argument("--dtype", choices=("fp32", "fp16", "bf16"), default=None,
                    help="default: bf16 on a GPU, fp32 on the CPU")
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--new-tokens", type=int, default=8)
    ap.add_argument("--interpret", action="store_true",
                    help="no GPU: run the Triton kernels in the CPU interpreter instead of the torch fallback")
    args = ap.parse_args(argv)
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is first imported

    import torch

    import autoopt

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bf16" if device.startswith("cuda") else "fp32")
    model = build(args.family, dtype, device)
    prompt = torch.randint(0, SMALL["vocab_size"], (1, 8), generator=torch.Generator().manual_seed(1)).to(device)

    def generate() -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = model.generate(prompt, max_new_tokens=args.new_tokens, do_sample=False)
        return out

    def last_logits() -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = model(prompt).logits[:, -1].float()
        return out

    before, ref = generate(), last_logits()
    t0 = time.perf_counter()
    report = autoopt.optimize(model)
    optimize_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    after = generate()
    generate_s = time.perf_counter() - t0

    print(report)
    print()
    print(f"{args.family} {dtype} on {device}: optimize {optimize_s:.2f} s, generate {args.new_tokens} tokens "
          f"{generate_s:.2f} s (kernels: {report.backend})")
    err = float((last_logits() - ref).norm() / ref.norm())
    print(f"last-position logits vs the original: relative error {err:.2e}")
    print(f"greedy tokens, original:  {before[0, prompt.shape[1]:].tolist()}")
    print(f"greedy tokens, optimized: {after[0, prompt.shape[1]:].tolist()} "
          f"({'identical' if torch.equal(before, after) else 'different: a near-tie rounded the other way'})")

    restored = autoopt.restore(model)
    back = generate()
    exact = torch.equal(before, back) and torch.equal(last_logits(), ref)
    print(f"restored {restored} modules; output after restore identical to the original: {exact}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
