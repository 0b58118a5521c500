"""Plain-text rendering of profiles, rankings and plugin lists for the CLI.

Kept free of rich so output is identical on a terminal, in a pipe and in CI
logs; everything here returns strings (the CLI decides where they go).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from autoopt.hardware.profile import GPUProfile, HardwareProfile

__all__ = ["format_bytes", "format_table", "profile_text"]


def format_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n % size else f"{int(n // size)} {unit}"
    return f"{int(n)} B"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, title: str = "") -> str:
    """A left-aligned text table with a header rule."""
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    out = [title] if title else []
    out += [line, "  ".join("-" * w for w in widths)]
    # a row shorter than the header leaves its last columns blank
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in cells]
    return "\n".join(out)


def _gpu_rows(g: GPUProfile) -> list[tuple[str, str, str]]:
    src = g.sources
    def row(label: str, field: str, value: Any) -> tuple[str, str, str]:
        return (label, _fmt(value), src.get(field, "missing" if value in (None, "", {}) else ""))
    peaks = ", ".join(f"{k} {v:g}" for k, v in g.peak_tflops.items()) or None
    measured = ", ".join(f"{k} {v:.1f}" for k, v in g.measured_tflops.items()) or None
    return [
        row("name", "name", g.name),
        row("known profile", "profile", g.profile),
        row("vendor / backend", "vendor", f"{g.vendor} / {g.backend}"),
        row("compute capability", "cc_major", f"{g.cc_major}.{g.cc_minor}" if g.cc else None),
        row("arch / generation", "arch", f"{g.arch} / {g.generation}" if g.arch else None),
        row("SMs", "sm_count", g.sm_count),
        row("threads per SM", "max_threads_per_sm", g.max_threads_per_sm),
        row("registers per SM", "regs_per_sm", g.regs_per_sm),
        row("SMEM per SM", "smem_per_sm_bytes", format_bytes(g.smem_per_sm_bytes) if g.smem_per_sm_bytes else None),
        row("SMEM per block (opt-in)", "smem_per_block_optin_bytes",
            f"{g.smem_per_block_optin_bytes} B" if g.smem_per_block_optin_bytes else None),
        row("L2", "l2_bytes", format_bytes(g.l2_bytes) if g.l2_bytes else None),
        row("memory total", "memory_total_bytes", format_bytes(g.memory_total_bytes) if g.memory_total_bytes else None),
        row("memory free", "memory_free_bytes", format_bytes(g.memory_free_bytes) if g.memory_free_bytes else None),
        row("memory bus / clock", "memory_bus_width_bits",
            f"{g.memory_bus_width_bits} bit @ {g.memory_clock_mhz} MHz" if g.memory_bus_width_bits else None),
        row("bandwidth spec GB/s", "mem_bandwidth_gbs", g.mem_bandwidth_gbs),
        row("bandwidth measured GB/s", "measured_bandwidth_gbs", g.measured_bandwidth_gbs),
        row("peak dense TFLOP/s", "peak_tflops", peaks),
        row("measured TFLOP/s", "measured_tflops", measured),
        row("PCIe", "pcie_gen", f"gen{g.pcie_gen} x{g.pcie_width}" if g.pcie_gen else None),
        row("NVLink", "nvlink_links",
            f"{g.nvlink_links} links, {g.nvlink_bandwidth_gbs:g} GB/s/dir" if g.nvlink_links and g.nvlink_bandwidth_gbs
            else g.nvlink_links),
        row("MIG", "mig_enabled", g.mig_enabled),
        row("driver", "driver_version", g.driver_version),
        row("features", "arch", ", ".join(g.features.names()) or None),
        row("fingerprint", "", g.fingerprint),
    ]


def profile_text(profile: HardwareProfile) -> str:
    """Readable summary of a profile: CPU, each GPU with provenance, links, notes."""
    c = profile.cpu
    parts = [f"autoopt profile: {profile.name} ({profile.origin}), fingerprint {profile.fingerprint}", ""]
    parts.append(format_table(("CPU", "value"), [
        ("model", c.model), ("vendor / arch", f"{c.vendor} / {c.arch}"),
        ("cores logical / physical", f"{c.logical_cores} / {c.physical_cores}"),
        ("SIMD", ", ".join(c.simd) or "-"),
        ("L1d / L2 / L3", " / ".join(format_bytes(x) for x in (c.l1d_bytes, c.l2_bytes, c.l3_bytes))),
        ("RAM total / available", f"{format_bytes(c.ram_total_bytes)} / {format_bytes(c.ram_available_bytes)}"),
        ("NUMA nodes", c.numa_nodes),
    ]))
    for g in profile.gpus:
        parts += ["", format_table((f"GPU {g.index}", "value", "source"), _gpu_rows(g))]
    if not profile.gpus:
        parts += ["", "GPUs: none detected"]
    if profile.links:
        parts += ["", format_table(("link", "kind", "links", "GB/s per direction"),
                                   [(f"GPU{lk.a} <-> GPU{lk.b}", lk.kind, lk.links, lk.bandwidth_gbs)
                                    for lk in profile.links])]
    if profile.notes:
        parts += ["", "notes:"] + [f"  - {n}" for n in profile.notes]
    return "\n".join(parts)


def plot_trace_classes(data: Mapping[str, Any], path: str) -> None:
    """A stacked bar per trace of GPU time per step by op class (from ``autoopt.trace.compare``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0, 0.0]
    for row in data["classes"]:
        vals = [row["a_us"], row["b_us"]]
        ax.bar(["A", "B"], vals, bottom=bottom, label=row["class"])
        bottom = [x + v for x, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("GPU time per step (us, measured)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
