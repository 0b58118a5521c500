"""Every kernel launch the backend makes compiles for the H100 (sm_90), checked on a machine with no GPU.

The interpreter tests prove the kernels compute the right thing but never compile them: Triton's CPU
interpreter does not type-check. ``_compile_sm90.py`` compiles the launches of each op's best configs
with Triton's own compiler for ``cuda:90`` (no driver needed), in a subprocess without the interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch and triton", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).with_name("_compile_sm90.py")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPT.parent)])}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    # Triton's cache goes under $HOME, which a CI runner may lack: a folder of this session's instead
    env = {"TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("triton-cache")), **_env()}
    out = subprocess.run([sys.executable, str(SCRIPT), "1"], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout)


def test_every_launch_of_the_ops_best_configs_compiles_for_sm90(report):
    assert report["failed"] == [], json.dumps(report["failed"][:5], indent=1)
    assert len(report["compiled"]) >= 60


def test_the_compiled_launches_cover_every_backend_kernel(report):
    from autoopt.backend.registry import KERNELS

    assert set(report["kernels"]) == set(KERNELS)


def test_the_compile_check_reports_a_dot_of_mismatched_types(tmp_path):
    # what the int4 fused-MoE kernel did on the H100 (a bf16 x uint8 tl.dot), and what the interpreter ran
    (tmp_path / "bad_kernel.py").write_text(textwrap.dedent("""
        import triton
        import triton.language as tl

        @triton.jit
        def bad(a_ptr, w_ptr, c_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            a = tl.load(a_ptr + offs[:, None] * BLOCK + offs[None, :])
            w = tl.load(w_ptr + offs[:, None] * BLOCK + offs[None, :])
            tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], tl.dot(a, w))
        """))
    code = ("import torch, bad_kernel, _compile_sm90 as c\n"
            "t = lambda d: torch.empty((16, 16), dtype=d)\n"
            "print(c._compile(bad_kernel.bad, (t(torch.bfloat16), t(torch.uint8), t(torch.float32)), "
            "{'BLOCK': 16, 'num_warps': 4}))")
    env = {"TRITON_CACHE_DIR": str(tmp_path / "triton-cache"), **_env()}
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(tmp_path)])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert "Both operands must be same dtype" in out.stdout, out.stderr[-3000:]


def test_the_kernels_a_triton_op_launches_copy_into_inductors_module_as_valid_python():
    # inductor copies a traced kernel and the globals it uses into a module it writes out as text; the escaped
    # newlines of a multi-line PTX constant broke that module ("unterminated string literal", H100, torch 2.11).
    # Run without the interpreter, whose kernels carry no source for inductor to copy.
    check = textwrap.dedent("""
        from torch._inductor.codegen.wrapper import user_defined_triton_kernel_transitive_closure_source_code as copy
        from autoopt.backend.kernels.fused_moe import _fused_moe_kernel, _moe_align_kernel
        from autoopt.backend.kernels.gated import _gated_kernel
        from autoopt.backend.kernels.norm import _rmsnorm_looped, _rmsnorm_single
        for kernel in (_fused_moe_kernel, _moe_align_kernel, _gated_kernel, _rmsnorm_single, _rmsnorm_looped):
            source = copy(kernel)
            assert "\\\\" not in source, kernel.__name__
            compile(source, kernel.__name__, "exec")
            print(kernel.__name__, len(source))
    """)
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=_env(), cwd=ROOT,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[::2] == ["_fused_moe_kernel", "_moe_align_kernel", "_gated_kernel", "_rmsnorm_single",
                                       "_rmsnorm_looped"]
