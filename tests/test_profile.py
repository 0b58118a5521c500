"""HardwareProfile is frozen, typed and round-trips through JSON and YAML."""

import dataclasses

import pytest

from autoopt.errors import ProfileError
from autoopt.hardware.profile import CPUProfile, GPUProfile, HardwareProfile, Link

H100 = GPUProfile(name="NVIDIA H100 80GB HBM3", cc_major=9, cc_minor=0, sm_count=132,
                  smem_per_block_optin_bytes=232448, memory_total_bytes=85520809984,
                  driver_version="580.159.04", peak_tflops={"bf16": 989.4})


def _machine() -> HardwareProfile:
    return HardwareProfile(name="m", cpu=CPUProfile(model="Xeon", logical_cores=16), gpus=(H100, H100.with_(index=1)),
                           links=(Link(a=0, b=1, kind="nvlink", links=18, bandwidth_gbs=450.0),))


def test_arch_and_generation_follow_the_capability():
    assert (H100.arch, H100.generation) == ("sm_90a", "Hopper")
    assert H100.features.wgmma and not H100.features.fp4


def test_profile_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        H100.sm_count = 1  # type: ignore[misc]


def test_json_round_trip_is_lossless():
    p = _machine()
    assert HardwareProfile.from_json(p.to_json()) == p


def test_yaml_round_trip_is_lossless():
    import yaml

    p = _machine()
    assert HardwareProfile.from_dict(yaml.safe_load(p.to_yaml())) == p


def test_fingerprint_is_stable_and_keyed_on_driver():
    assert H100.fingerprint == GPUProfile.from_dict(H100.to_dict()).fingerprint
    assert H100.fingerprint != H100.with_(driver_version="575.0").fingerprint


def test_fp16_rate_falls_back_to_bf16_and_measured_wins():
    assert H100.tflops("fp16") == 989.4
    assert H100.with_(measured_tflops={"bf16": 700.0}).tflops("bf16") == 700.0


def test_link_lookup_is_symmetric():
    assert _machine().link_between(1, 0).bandwidth_gbs == 450.0


@pytest.mark.parametrize("gpu,field", [({"name": "x", "sm_count": -4}, "gpus[0].sm_count"),
                                       ({"name": "x", "sm_count": "many"}, "gpus[0].sm_count"),
                                       ({"name": "x", "wat": 1}, "gpus[0].wat"),
                                       ({"sm_count": 4}, "gpus[0].name")])
def test_bad_fields_are_profile_errors_naming_the_field(gpu, field):
    with pytest.raises(ProfileError) as err:
        HardwareProfile.from_dict({"name": "m", "gpus": [gpu]}, source="m.json")
    assert err.value.field == field and "m.json" in str(err.value)


def test_unsupported_schema_version_is_refused():
    with pytest.raises(ProfileError, match="schema 7"):
        HardwareProfile.from_dict({"name": "m", "schema": 7})
