"""Feature flags come from the parsed arch variant, across every generation autoopt knows."""

import pytest

from autoopt.hardware.features import arch_variant, features_for, generation_for, parse_arch

#: arch -> (generation, flags that must be on, flags that must be off)
TABLE = {
    "sm_70": ("Volta", {"tensor_cores"}, {"bf16", "fp8", "tma", "wgmma", "fp4", "async_copy"}),
    "sm_75": ("Turing", {"tensor_cores"}, {"bf16", "fp8", "tma", "wgmma"}),
    "sm_80": ("Ampere", {"bf16", "tf32", "async_copy"}, {"fp8", "tma", "wgmma", "clusters"}),
    "sm_86": ("Ampere", {"bf16", "async_copy"}, {"fp8", "tma", "wgmma"}),
    "sm_89": ("Ada", {"fp8", "bf16"}, {"tma", "wgmma", "fp4", "clusters"}),
    "sm_90a": ("Hopper", {"fp8", "tma", "clusters", "wgmma"}, {"fp4", "tcgen05"}),
    "sm_100a": ("Blackwell", {"fp8", "fp4", "tma", "clusters", "tcgen05"}, {"wgmma"}),
    "sm_120": ("Blackwell consumer", {"fp8", "fp4", "tma"}, {"wgmma", "tcgen05"}),
    "gfx942": ("CDNA3", {"mfma", "bf16", "fp8"}, {"wgmma", "tma", "tcgen05", "fp4"}),
}


@pytest.mark.parametrize("arch", sorted(TABLE))
def test_generation_and_flags_follow_the_arch_variant(arch):
    generation, on, off = TABLE[arch]
    flags = features_for(arch).to_dict()
    assert generation_for(arch) == generation
    assert {name for name in on if not flags[name]} == set()
    assert {name for name in off if flags[name]} == set()


def test_blackwell_capability_10_is_not_compared_as_a_string():
    # "10.0" < "7.0" as strings; parsed as numbers Blackwell has everything Volta has and more.
    assert parse_arch("sm_100a").cc > parse_arch("sm_70").cc
    assert features_for("sm_100a").tensor_cores


def test_plain_sm_90_without_the_a_suffix_has_no_wgmma():
    assert features_for("sm_90").tma and not features_for("sm_90").wgmma


@pytest.mark.parametrize("cc,arch", [((9, 0), "sm_90a"), ((10, 0), "sm_100a"), ((8, 9), "sm_89"),
                                     ((12, 0), "sm_120"), ((7, 5), "sm_75")])
def test_arch_variant_of_a_capability(cc, arch):
    assert arch_variant(*cc) == arch


@pytest.mark.parametrize("bad", ["", "sm", "sm_9", "compute_90", "10.0", "gfx"])
def test_unparseable_arch_has_no_features(bad):
    assert features_for(bad).names() == ()
    with pytest.raises(ValueError):
        parse_arch(bad)
