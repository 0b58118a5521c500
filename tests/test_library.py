"""The known-hardware profile library: shipped files, lookup, matching, and bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from autoopt._paths import profiles_dir
from autoopt.errors import ProfileError, UnknownProfileError
from autoopt.hardware import library
from autoopt.hardware.library import (
    KnownDevice,
    get_known,
    known_devices,
    known_names,
    load_profile,
    match_gpu,
    parse_known,
)
from autoopt.hardware.profile import DTYPES, HardwareProfile

SHIPPED = sorted(p.stem for p in profiles_dir().glob("*.yaml"))
REQUIRED = ("a100-sxm-40gb", "a100-sxm-80gb", "a10", "l4", "l40s", "rtx-3060", "rtx-3090", "rtx-4090",
            "rtx-5090", "h100-sxm", "h100-pcie", "h200", "gh200", "b200", "gb200", "mi300x",
            "stress-12kb", "toy-64kb", "h100-sxm-8x", "h200-2x", "h200-4x")

MINIMAL = """\
name: tiny
gpu:
  name: Tiny GPU
  cc_major: 8
  cc_minor: 0
  sm_count: 2
  smem_per_sm_bytes: 1024
"""


# ----------------------------------------------------------------- shipped files

def test_every_required_profile_ships():
    assert set(REQUIRED) <= set(known_names())


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_name_is_lowercase_hyphen_and_equals_file_stem(name):
    dev = get_known(name)
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", dev.name)
    assert Path(dev.path).stem == dev.name == name


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_starts_with_source_comments(name):
    text = (profiles_dir() / f"{name}.yaml").read_text()
    assert text.startswith("#")


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_round_trips_through_to_dict(name):
    dev = get_known(name)
    assert KnownDevice.from_dict(dev.to_dict()) == dev


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_round_trips_through_yaml_text(name):
    dev = get_known(name)
    data = dev.to_dict()
    data.pop("path")
    assert parse_known(yaml.safe_dump(data), source=dev.path) == dev


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_as_hardware_profile_round_trips_json_and_yaml(name):
    prof = load_profile(name)
    assert HardwareProfile.from_json(prof.to_json()) == prof
    assert HardwareProfile.from_dict(yaml.safe_load(prof.to_yaml())) == prof


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_is_self_consistent(name):
    gpu = get_known(name).gpu
    assert gpu.sm_count is None or gpu.sm_count > 0
    assert set(gpu.peak_tflops) <= set(DTYPES)
    assert gpu.peak_tflops, "every shipped device states its dense peak rates"
    assert gpu.mem_bandwidth_gbs and gpu.mem_bandwidth_gbs > 0
    assert gpu.smem_per_block_optin_bytes <= gpu.smem_per_sm_bytes
    assert gpu.generation not in ("", "unknown")


def test_to_profile_stamps_index_profile_name_and_library_sources():
    prof = load_profile("h100-sxm")
    assert prof.origin == "library"
    assert prof.name == "h100-sxm"
    gpu = prof.gpu
    assert (gpu.index, gpu.profile) == (0, "h100-sxm")
    assert gpu.sources["sm_count"] == gpu.sources["peak_tflops"] == "library"
    assert "uuid" not in gpu.sources and "driver_version" not in gpu.sources


# ----------------------------------------------------------------- device facts

def test_h100_sxm_facts_match_the_real_capture():
    gpu = get_known("h100-sxm").gpu
    assert gpu.sm_count == 132
    assert gpu.smem_per_block_optin_bytes == 232448
    assert gpu.smem_per_sm_bytes == 233472
    assert gpu.l2_bytes == 52428800
    assert gpu.memory_total_bytes == 85520809984
    assert gpu.arch == "sm_90a"
    assert gpu.generation == "Hopper"
    assert gpu.features.wgmma is True
    assert gpu.peak_tflops["bf16"] == 989.4


def test_b200_has_tcgen05_and_dense_fp4():
    gpu = get_known("b200").gpu
    assert gpu.arch == "sm_100a"
    assert gpu.features.tcgen05 and gpu.features.fp4
    assert not gpu.features.wgmma
    assert gpu.peak_tflops["fp4"] == 9000.0


def test_rtx_5090_has_fp4_but_neither_tcgen05_nor_wgmma():
    gpu = get_known("rtx-5090").gpu
    assert gpu.arch == "sm_120"
    assert gpu.features.fp4
    assert not gpu.features.tcgen05 and not gpu.features.wgmma
    assert gpu.smem_per_block_optin_bytes == 101376


def test_mi300x_is_rocm_gfx942_cdna3_with_wave64():
    gpu = get_known("mi300x").gpu
    assert (gpu.vendor, gpu.backend, gpu.arch, gpu.generation) == ("amd", "rocm", "gfx942", "CDNA3")
    assert gpu.warp_size == 64
    assert gpu.sm_count == 304
    assert gpu.features.mfma


def test_a100_variants_share_smem_limits_of_sm80():
    for name in ("a100-sxm-40gb", "a100-sxm-80gb"):
        gpu = get_known(name).gpu
        assert (gpu.smem_per_sm_bytes, gpu.smem_per_block_optin_bytes) == (167936, 166912)


def test_stress_12kb_is_a_virtual_sm80_gpu_with_12288_bytes_of_smem():
    dev = get_known("stress-12kb")
    assert dev.virtual
    assert dev.gpu.smem_per_block_optin_bytes == dev.gpu.smem_per_sm_bytes == 12288
    assert dev.gpu.arch == "sm_80"


def test_toy_64kb_has_65536_bytes_of_smem():
    gpu = get_known("toy-64kb").gpu
    assert gpu.smem_per_block_optin_bytes == gpu.smem_per_sm_bytes == 65536


def test_h100_sxm_8x_has_eight_gpus_all_pairs_linked_at_450_gbs():
    prof = load_profile("h100-sxm-8x")
    assert len(prof.gpus) == 8
    assert [g.index for g in prof.gpus] == list(range(8))
    assert len(prof.links) == 28  # 8 choose 2
    link = prof.link_between(3, 6)
    assert (link.kind, link.links, link.bandwidth_gbs) == ("nvlink", 18, 450.0)


def test_machine_profiles_use_the_same_gpu_as_their_single_gpu_entry():
    assert get_known("h100-sxm-8x").gpu == get_known("h100-sxm").gpu
    assert get_known("h200-2x").gpu == get_known("h200").gpu
    assert get_known("h200-4x").gpu == get_known("h200").gpu


def test_h200_2x_and_4x_have_one_link_per_pair():
    assert len(load_profile("h200-2x").links) == 1
    assert len(load_profile("h200-4x").links) == 6


def test_editing_a_loaded_profile_leaves_the_library_unchanged():
    prof = load_profile("h100-sxm")
    prof.gpu.peak_tflops["bf16"] = 1.0
    assert get_known("h100-sxm").gpu.peak_tflops["bf16"] == 989.4
    assert load_profile("h100-sxm").gpu.peak_tflops["bf16"] == 989.4


def test_single_gpu_profile_has_no_links():
    assert load_profile("h100-sxm").links == ()


def test_mesh_topology_splits_links_between_peers(tmp_path):
    text = MINIMAL.replace("name: tiny", "name: mesh4") + "count: 4\n" + \
        "interconnect: {kind: nvlink, links: 18, version: 4, bandwidth_gbs: 450.0, topology: mesh}\n"
    (tmp_path / "mesh4.yaml").write_text(text)
    prof = load_profile("mesh4", extra_dirs=[tmp_path])
    link = prof.link_between(0, 3)
    assert (link.links, link.bandwidth_gbs) == (6, 150.0)


def test_gh200_carries_its_grace_cpu():
    cpu = get_known("gh200").to_profile().cpu
    assert cpu.arch == "aarch64" and cpu.physical_cores == 72


# ----------------------------------------------------------------- lookup

def test_get_known_accepts_an_alias_case_insensitively():
    assert get_known("nvidia h100 80gb hbm3").name == "h100-sxm"


def test_unknown_name_suggests_the_close_one():
    with pytest.raises(UnknownProfileError) as info:
        get_known("h100-sxn")
    assert info.value.suggestions[0] == "h100-sxm"
    assert "h100-sxm" in str(info.value)


def test_load_profile_of_unknown_name_raises_unknown_profile_error():
    with pytest.raises(UnknownProfileError):
        load_profile("a100-sxm-99gb")


def test_known_devices_is_cached():
    assert known_devices() is known_devices()


def test_duplicate_names_across_dirs_are_an_error(tmp_path):
    (tmp_path / "h100-sxm.yaml").write_text(MINIMAL.replace("name: tiny", "name: h100-sxm"))
    with pytest.raises(ProfileError, match="duplicate profile name 'h100-sxm'"):
        known_devices([tmp_path])


def test_file_name_must_match_profile_name(tmp_path):
    (tmp_path / "other.yaml").write_text(MINIMAL)
    with pytest.raises(ProfileError) as info:
        known_devices([tmp_path])
    assert info.value.field == "name" and "other.yaml" in str(info.value)


def test_extra_dir_that_does_not_exist_is_an_error(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        known_devices([tmp_path / "missing"])


def test_extra_dir_profiles_are_found_by_name(tmp_path):
    (tmp_path / "tiny.yaml").write_text(MINIMAL)
    assert "tiny" in known_names([tmp_path])
    assert get_known("tiny", [tmp_path]).gpu.sm_count == 2


# ----------------------------------------------------------------- matching

def test_match_by_pci_device_id():
    assert match_gpu(pci_device_id=0x2330).name == "h100-sxm"


def test_match_by_nvml_packed_pci_id():
    assert match_gpu(pci_device_id=0x233010DE).name == "h100-sxm"


def test_pci_id_wins_over_a_misleading_name():
    assert match_gpu(name="NVIDIA H100 PCIe", pci_device_id=0x2330).name == "h100-sxm"


def test_match_mi300x_by_pci_device_id():
    assert match_gpu(pci_device_id=0x74A1).name == "mi300x"


def test_match_by_exact_name():
    assert match_gpu(name="NVIDIA H100 80GB HBM3").name == "h100-sxm"


def test_match_by_name_ignores_case_and_vendor_prefix():
    assert match_gpu(name="h200").name == "h200"
    assert match_gpu(name="NVIDIA GeForce RTX 4090").name == "rtx-4090"


def test_a100_40_and_80_gb_are_told_apart_by_memory():
    forty = match_gpu(name="NVIDIA A100-SXM4", cc=(8, 0), memory_total_bytes=40 * 2**30)
    eighty = match_gpu(name="NVIDIA A100-SXM4", cc=(8, 0), memory_total_bytes=80 * 2**30)
    assert (forty.name, eighty.name) == ("a100-sxm-40gb", "a100-sxm-80gb")


def test_fuzzy_match_does_not_confuse_a_ti_with_the_plain_card():
    assert match_gpu(name="NVIDIA GeForce RTX 3060 Ti", cc=(8, 6)) is None


def test_fuzzy_match_needs_the_same_compute_capability():
    assert match_gpu(name="NVIDIA A100-SXM4", cc=(9, 0)) is None


def test_unknown_gpu_matches_nothing():
    assert match_gpu(name="NVIDIA Tesla T4", pci_device_id=0x1EB8, cc=(7, 5)) is None


def test_machine_and_virtual_profiles_are_never_matched():
    assert match_gpu(name="DGX H100") is None
    assert match_gpu(name="autoopt virtual stress-12kb", cc=(8, 0)) is None


# ----------------------------------------------------------------- files by path

def test_saved_full_profile_json_loads_by_path(tmp_path):
    prof = load_profile("l4")
    path = tmp_path / "saved.json"
    path.write_text(prof.to_json(indent=2))
    assert load_profile(str(path)) == prof
    assert load_profile(path) == prof


def test_saved_full_profile_yaml_loads_by_path(tmp_path):
    prof = load_profile("h200-2x")
    path = tmp_path / "saved.yaml"
    path.write_text(prof.to_yaml())
    assert load_profile(path) == prof


def test_known_device_yaml_loads_by_path(tmp_path):
    path = tmp_path / "custom.yml"
    path.write_text(MINIMAL)
    prof = load_profile(path)
    assert prof.name == "tiny" and prof.gpu.sm_count == 2 and prof.origin == "library"


def test_missing_file_path_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="no such profile file") as info:
        load_profile(str(tmp_path / "nope.json"))
    assert not isinstance(info.value, UnknownProfileError)


def test_directory_path_is_a_profile_error(tmp_path):
    with pytest.raises(ProfileError, match="is a directory"):
        load_profile(tmp_path)


def test_file_that_is_neither_kind_of_profile_is_a_profile_error(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(ProfileError, match="neither"):
        load_profile(path)


def test_bad_saved_profile_names_file_and_field(tmp_path):
    data = load_profile("l4").to_dict()
    data["gpus"][0]["sm_count"] = "many"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert info.value.source == str(path) and "sm_count" in info.value.field


# ----------------------------------------------------------------- bad files

def _error(text: str) -> ProfileError:
    with pytest.raises(ProfileError) as info:
        parse_known(text, source="bad.yaml")
    assert info.value.source == "bad.yaml"
    assert str(info.value).startswith("bad.yaml: ")
    return info.value


def test_from_dict_of_a_non_mapping_is_a_profile_error():
    with pytest.raises(ProfileError, match="mapping"):
        KnownDevice.from_dict(["not", "a", "mapping"], source="x.yaml")  # type: ignore[arg-type]


def test_minimal_file_parses():
    dev = parse_known(MINIMAL, source="tiny.yaml")
    assert (dev.name, dev.count, dev.gpu.arch, dev.path) == ("tiny", 1, "sm_80", "tiny.yaml")


def test_unknown_top_level_field_is_named():
    assert _error(MINIMAL + "colour: green\n").field == "colour"


def test_unknown_gpu_field_is_named():
    assert _error(MINIMAL + "  sm_cnt: 3\n").field == "gpu.sm_cnt"


def test_wrong_type_is_named():
    err = _error(MINIMAL.replace("sm_count: 2", "sm_count: two"))
    assert err.field == "gpu.sm_count" and "integer" in str(err)


def test_negative_size_is_named():
    err = _error(MINIMAL.replace("smem_per_sm_bytes: 1024", "smem_per_sm_bytes: -1024"))
    assert err.field == "gpu.smem_per_sm_bytes" and "negative" in str(err)


def test_missing_name_is_named():
    assert _error(MINIMAL.replace("name: tiny\n", "")).field == "name"


def test_missing_gpu_is_named():
    assert _error("name: tiny\n").field == "gpu"


def test_missing_gpu_name_is_named():
    assert _error(MINIMAL.replace("  name: Tiny GPU\n", "")).field == "gpu.name"


def test_bad_yaml_syntax_is_reported_with_position():
    err = _error("name: [tiny\ngpu: {name: x}\n")
    assert "not valid YAML" in str(err) and "line" in str(err)


def test_impossible_date_is_bad_yaml_not_a_crash():
    assert "not valid YAML" in str(_error("name: 2001-13-45\n"))


def test_top_level_must_be_a_mapping():
    assert "mapping" in str(_error("- just\n- a list\n"))


def test_name_must_be_lowercase_hyphen():
    assert _error(MINIMAL.replace("name: tiny", "name: Tiny_GPU")).field == "name"


def test_count_must_be_at_least_one():
    assert _error(MINIMAL + "count: 0\n").field == "count"


def test_optin_smem_cannot_exceed_smem_per_sm():
    assert _error(MINIMAL + "  smem_per_block_optin_bytes: 2048\n").field == "gpu.smem_per_block_optin_bytes"


def test_unknown_peak_dtype_is_named():
    assert _error(MINIMAL + "  peak_tflops: {fp12: 3.0}\n").field == "gpu.peak_tflops.fp12"


def test_per_card_fields_are_not_allowed():
    assert _error(MINIMAL + "  uuid: GPU-1234\n").field == "gpu.uuid"


def test_arch_must_agree_with_compute_capability():
    assert _error(MINIMAL + "  arch: sm_90a\n").field == "gpu.arch"


def test_backend_must_fit_vendor():
    assert _error(MINIMAL + "  backend: rocm\n").field == "gpu.backend"


def test_unknown_link_kind_is_named():
    assert _error(MINIMAL + "interconnect: {kind: carrier-pigeon}\n").field == "interconnect.kind"


def test_pci_id_must_fit_16_bits():
    assert _error(MINIMAL + "pci_device_ids: [0x233010DE]\n").field == "pci_device_ids[0]"


def test_bad_shipped_style_file_in_extra_dir_names_the_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(MINIMAL + "  sm_count_typo: 1\n")
    with pytest.raises(ProfileError) as info:
        known_devices([tmp_path])
    assert info.value.source == str(path) and info.value.field == "gpu.sm_count_typo"


def test_clear_cache_reloads_edited_files(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(MINIMAL)
    assert get_known("tiny", [tmp_path]).gpu.sm_count == 2
    path.write_text(MINIMAL.replace("sm_count: 2", "sm_count: 3"))
    library.clear_cache()
    assert get_known("tiny", [tmp_path]).gpu.sm_count == 3


def test_a_profile_with_an_absurd_gpu_count_is_refused_before_it_is_built(tmp_path):
    from autoopt.errors import ProfileError
    from autoopt.hardware.library import MAX_GPUS
    from autoopt.hardware.library import load_profile as load

    text = (Path(__file__).resolve().parents[1] / "profiles" / "h100-sxm.yaml").read_text()
    bad = tmp_path / "huge.yaml"
    bad.write_text(text.replace("name: h100-sxm", "name: huge", 1) + f"\ncount: {MAX_GPUS + 1}\n")
    with pytest.raises(ProfileError, match=r"count.*1\.\.1024|1\.\.1024"):
        load(bad)


@pytest.mark.parametrize("kind", ["device", "fifo", "huge", "binary"])
def test_a_profile_path_that_is_not_a_small_regular_text_file_is_refused_without_reading_it(tmp_path, kind):
    import os

    from autoopt.hardware.library import load_profile as load

    path = {"device": Path("/dev/urandom"), "fifo": tmp_path / "p.yaml", "huge": tmp_path / "h.yaml",
            "binary": tmp_path / "b.yaml"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(64 << 20)
    elif kind == "binary":
        path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ProfileError, match=r"regular file|at most|not UTF-8"):
        load(path)
