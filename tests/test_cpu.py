"""CPU detection: real values of this machine, the py-cpuinfo fallback, and never raising."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import psutil
import pytest

from autoopt.hardware import cpu as cpu_mod
from autoopt.hardware.cpu import capture_cpu, cpu_from_raw, detect_cpu, normalise_simd

FIXTURES = Path(__file__).parent / "fixtures"
PROC = Path("/proc/cpuinfo")
linux_only = pytest.mark.skipif(not PROC.exists(), reason="needs /proc/cpuinfo (Linux)")


def _proc_flags() -> set[str]:
    for line in PROC.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _sysfs_cache(level: str, kind: str) -> int:
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        if (entry / "level").read_text().strip() == level and (entry / "type").read_text().strip() == kind:
            return int((entry / "size").read_text().strip().rstrip("K")) * 1024
    raise LookupError(level)


def test_logical_cores_are_os_cpu_count():
    assert detect_cpu()[0].logical_cores == os.cpu_count()


def test_physical_cores_are_psutils_count():
    assert detect_cpu()[0].physical_cores == psutil.cpu_count(logical=False)


def test_ram_total_is_psutils_total():
    assert detect_cpu()[0].ram_total_bytes == psutil.virtual_memory().total


def test_arch_is_platform_machine():
    import platform

    assert detect_cpu()[0].arch == platform.machine()


@linux_only
def test_simd_flags_match_proc_cpuinfo():
    flags = _proc_flags()
    simd = detect_cpu()[0].simd
    # On x86 Linux the canonical names are the kernel's own flag names.
    for name in ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                 "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"):
        assert (name in simd) == (name in flags), name
    arm64 = cpu_mod.platform.machine() == "aarch64"
    assert ("neon" in simd) == ("asimd" in flags or "neon" in flags or arm64)


@linux_only
def test_model_and_vendor_come_from_proc_cpuinfo():
    text = PROC.read_text()
    prof = detect_cpu()[0]
    if "model name" in text:
        assert f"model name\t: {prof.model}" in text
    if "vendor_id" in text:
        assert f"vendor_id\t: {prof.vendor}" in text


@pytest.mark.skipif(not Path("/sys/devices/system/cpu/cpu0/cache").is_dir(), reason="needs sysfs caches")
def test_cache_sizes_are_cpu0s_sysfs_sizes():
    prof = detect_cpu()[0]
    assert prof.l1d_bytes == _sysfs_cache("1", "Data")
    assert prof.l2_bytes == _sysfs_cache("2", "Unified")


@pytest.mark.skipif(not Path("/sys/devices/system/node").is_dir(), reason="needs sysfs NUMA nodes")
def test_numa_nodes_count_sysfs_nodes():
    nodes = [p for p in Path("/sys/devices/system/node").iterdir() if p.name[4:].isdigit()
             and p.name.startswith("node")]
    assert detect_cpu()[0].numa_nodes == len(nodes)


@linux_only
def test_linux_detection_never_calls_py_cpuinfo(monkeypatch):
    def boom():
        raise AssertionError("py-cpuinfo is slow (~1.2 s) and must not run when /proc/cpuinfo exists")

    monkeypatch.setattr(cpu_mod, "_py_cpuinfo", boom)
    assert detect_cpu()[0].logical_cores == os.cpu_count()


@pytest.fixture(scope="module")
def without_proc_cpuinfo(tmp_path_factory):
    """Two captures with /proc/cpuinfo hidden, counting calls to the real py-cpuinfo."""
    import cpuinfo

    calls = []
    real = cpuinfo.get_cpu_info

    def counted():
        calls.append(1)
        return real()

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu_mod, "_PROC_CPUINFO", tmp_path_factory.mktemp("x") / "no-cpuinfo")
        mp.setattr(cpuinfo, "get_cpu_info", counted)
        cpu_mod._py_cpuinfo.cache_clear()
        raws = [capture_cpu(), capture_cpu()]
        cpu_mod._py_cpuinfo.cache_clear()
    return raws, len(calls)


@linux_only
def test_without_proc_cpuinfo_py_cpuinfo_gives_the_same_simd(without_proc_cpuinfo):
    raws, _ = without_proc_cpuinfo
    assert raws[0]["source"] == "py-cpuinfo"
    assert cpu_from_raw(raws[0])[0].simd == normalise_simd(sorted(_proc_flags()), cpu_mod.platform.machine())


@linux_only
def test_py_cpuinfo_runs_once_per_process(without_proc_cpuinfo):
    assert without_proc_cpuinfo[1] == 1


def test_missing_psutil_is_a_note_not_an_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # import psutil now raises ImportError
    prof, notes = detect_cpu()
    assert prof.ram_total_bytes == 0
    assert "CPU: RAM size unknown (psutil not installed)" in notes


def test_unreadable_proc_cpuinfo_is_a_note(monkeypatch, tmp_path):
    folder = tmp_path / "cpuinfo"
    folder.mkdir()  # exists, but reading a folder raises IsADirectoryError
    monkeypatch.setattr(cpu_mod, "_PROC_CPUINFO", folder)
    prof, notes = detect_cpu()
    assert prof.logical_cores == os.cpu_count()
    assert any(n.startswith("CPU: SIMD flags unknown") for n in notes)


def test_nothing_captured_gives_one_note():
    prof, notes = cpu_from_raw({"error": "not captured on this host"})
    assert prof.model == "unknown" and prof.logical_cores == 0
    assert notes == ["CPU: not captured on this host"]


def test_py_cpuinfo_spellings_are_normalised():
    assert normalise_simd(["avx512vnni", "avx512bf16", "avx512fp16", "amx-tile"]) == (
        "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile")


def test_arm_asimd_is_neon_and_sve_kept():
    assert normalise_simd(["fp", "asimd", "sve", "sve2"]) == ("neon", "sve", "sve2")


def test_aarch64_always_has_neon():
    assert normalise_simd([], "arm64") == ("neon",)


def test_simd_names_are_listed_in_canonical_order():
    assert normalise_simd(["amx_int8", "fma", "avx2", "avx"]) == ("avx", "avx2", "fma", "amx_int8")


def test_h100_hosts_xeon_from_its_lscpu_capture():
    raw = json.loads((FIXTURES / "h100_raw.json").read_text())["cpu"]
    prof, notes = cpu_from_raw(raw)
    assert prof.logical_cores == 16 and prof.physical_cores == 16
    assert prof.simd == ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                         "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")
    assert (prof.l1d_bytes, prof.l2_bytes, prof.l3_bytes) == (48 * 1024, 2 << 20, 300 << 20)
    assert notes == ["CPU: RAM size unknown (not in the h100 capture)"]
