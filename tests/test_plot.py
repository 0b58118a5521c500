"""The roofline chart: a fixed-size PNG of the measured rows, spec and measured roofs, a replot script."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from autoopt.backend.bench import BenchRow
from autoopt.backend.runner import Result
from autoopt.errors import BackendError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import KernelConfig
from autoopt.kernels.ops import OpSpec

ROOT = Path(__file__).resolve().parents[1]
# H200 datasheet: 4.8 TB/s HBM3e, 989.4 dense bf16 TFLOP/s, 67 fp32; measured on the lent H200
# (benchmarks/results/h200/autoopt_profile.json): 4221.3 GB/s copy, 693.5 bf16 TFLOP/s.
H200 = GPUProfile(name="NVIDIA H200", cc_major=9, cc_minor=0, mem_bandwidth_gbs=4800.0,
                  peak_tflops={"bf16": 989.4, "fp32": 67.0, "tf32": 494.7})
H200_MEASURED = H200.with_(measured_bandwidth_gbs=4221.3, measured_tflops={"bf16": 693.5})
GEMM_CFG = KernelConfig(kernel="gemm_tma", params=dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64))
ADD_CFG = KernelConfig(kernel="add", params=dict(BLOCK_SIZE=1024, num_warps=4))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def measured(kind: str, shape: tuple[int, ...], us: float, cfg: KernelConfig = GEMM_CFG) -> Result:
    op = OpSpec(kind=kind, shape=shape, dtype="bf16")
    return Result(op=op, config=cfg, label="measured", us=us, tflops=op.flops / (us * 1e-6) / 1e12,
                  gbs=op.min_bytes / (us * 1e-6) / 1e9, roofline_pct=50.0)


def mixed_rows() -> list[Result]:
    op = OpSpec(kind="gemm", shape=(256, 4096, 4096), dtype="bf16")
    return [measured("gemm", (4096, 4096, 4096), 202.9), measured("gemv", (1, 4096, 4096), 16.4),
            measured("add", (4096, 4096), 30.0, ADD_CFG),
            Result(op=op, config=GEMM_CFG, label="predicted", us=25.0, tflops=343.6),
            Result(op=op, config=GEMM_CFG, label="withheld", us=1.0, tflops=8590.0),
            Result(op=op, config=GEMM_CFG, label="rejected", reason="BLOCK_M too large"),
            Result(op=op, config=GEMM_CFG, label="measured")]  # no time recorded


def test_chart_is_a_png_of_the_fixed_page_size(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from autoopt.backend.plot import DPI, FIG_SIZE_IN, roofline_png

    out = roofline_png(mixed_rows(), H200_MEASURED, tmp_path / "r.png")
    assert out == tmp_path / "r.png"
    assert png_size(out) == (round(FIG_SIZE_IN[0] * DPI), round(FIG_SIZE_IN[1] * DPI)) == (1440, 1080)


def test_rows_without_a_measured_time_are_left_out_not_fatal(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from autoopt.backend.plot import roofline_png

    rows = mixed_rows()
    assert png_size(roofline_png(rows, H200, tmp_path / "a.png")) == (1440, 1080)
    assert png_size(roofline_png(rows[3:] + rows[:1], H200, tmp_path / "b.png")) == (1440, 1080)


def test_no_measured_row_is_refused_with_the_labels_seen(tmp_path) -> None:
    from autoopt.backend.plot import roofline_png

    with pytest.raises(BackendError, match=r"no row has a time measured.*predicted, rejected, withheld"):
        roofline_png(mixed_rows()[3:6], H200, tmp_path / "r.png")
    assert not (tmp_path / "r.png").exists()


def test_bench_json_rows_are_accepted_as_dicts(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from autoopt.backend.plot import roofline_png

    rows = [BenchRow(result=r, torch_us=r.us, ratio=1.0).to_dict() for r in mixed_rows()[:3]]
    assert png_size(roofline_png(json.loads(json.dumps(rows)), H200, tmp_path / "r.png")) == (1440, 1080)


def test_thirty_rows_fit_the_page(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    from autoopt.backend.plot import roofline_png

    rows = [measured("gemm", (m, 4096, 4096), 10.0 + m / 8) for m in range(64, 64 * 16, 64)]
    rows += [measured("silu_mul", (r, 14336), 3.0 + r / 50) for r in range(128, 128 * 16, 128)]
    assert len(rows) == 30
    assert png_size(roofline_png(rows, H200_MEASURED, tmp_path / "r.png")) == (1440, 1080)


def test_missing_matplotlib_is_a_backend_error(tmp_path, monkeypatch) -> None:
    from autoopt.backend.plot import roofline_png

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(BackendError, match="needs matplotlib"):
        roofline_png(mixed_rows(), H200, tmp_path / "r.png")


def test_spec_roofs_are_solid_and_measured_ones_added_with_their_numbers() -> None:
    from autoopt.backend.plot import _roofs

    spec_only = _roofs(H200, ["bf16", "fp32"])
    assert [(r.dtype, r.measured) for r in spec_only] == [("bf16", False), ("fp32", False)]
    both = _roofs(H200_MEASURED, ["bf16", "fp32"])
    assert [(r.dtype, r.measured, r.bw, r.peak) for r in both] == [
        ("bf16", False, 4800.0, 989.4), ("bf16", True, 4221.3, 693.5),
        ("fp32", False, 4800.0, 67.0), ("fp32", True, 4221.3, 67.0)]
    assert both[1].label == "measured bf16: 4221.3 GB/s · 693.5 TFLOP/s"
    assert both[3].label == "measured fp32: 4221.3 GB/s · 67 TFLOP/s (spec)"


def test_roof_is_the_lower_of_bandwidth_times_intensity_and_peak() -> None:
    from autoopt.backend.plot import _roofs

    spec_bf16 = _roofs(H200, ["bf16"])[0]
    assert spec_bf16.at(1.0) == pytest.approx(4.8)  # 4800 GB/s x 1 FLOP/B = 4.8 TFLOP/s
    assert spec_bf16.at(100.0) == pytest.approx(480.0)
    assert spec_bf16.at(1000.0) == pytest.approx(989.4)  # past the ridge at 989.4 / 4.8 = 206 FLOP/B


def test_replot_script_rebuilds_the_chart_from_a_bench_json(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    rows = [BenchRow(result=r).to_dict() for r in mixed_rows()]
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"profile": "h200", "gpu": "NVIDIA H200", "rows": rows}))
    out = tmp_path / "r.png"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "replot.py"), str(bench), "--profile", "h200",
                           "--measured-bandwidth-gbs", "4221.3", "--measured-tflops", "bf16=693.5",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "3 measured rows of 7" in proc.stderr and "4221.3 measured GB/s" in proc.stderr
    assert png_size(out) == (1440, 1080)
