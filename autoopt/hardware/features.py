"""Architecture variants, GPU generations and the feature flags they imply.

Feature flags are derived from the *arch variant* parsed into integers, never by
comparing capability strings: ``"10.0" < "7.0"`` is true as strings, and a tool
that compared them that way denied Blackwell every modern feature.

Facts encoded here (NVIDIA PTX ISA and CUDA programming guide):
- ``cp.async`` (LDGSTS) from sm_80; native FP8 (e4m3/e5m2 MMA) from sm_89;
- TMA (bulk tensor copy) and thread-block clusters from sm_90;
- WGMMA only on sm_90a (the arch-specific Hopper target) — not on Blackwell;
- tcgen05/UMMA and tensor memory on datacenter Blackwell (sm_100a, sm_103a);
  consumer Blackwell (sm_120/121) has neither tcgen05 nor the 228 KB SMEM;
- native FP4 (NVFP4/MXFP4) MMA from sm_100 (datacenter and consumer Blackwell).
AMD CDNA (gfx90a, gfx942, gfx950) exposes MFMA matrix cores; FP8 from gfx942.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from functools import lru_cache

__all__ = [
    "ArchVariant",
    "Features",
    "arch_variant",
    "features_for",
    "generation_for",
    "parse_arch",
]

_SM_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")
_GFX_RE = re.compile(r"^gfx(\d+)([0-9a-f])([0-9a-f])?$")


@dataclass(frozen=True, slots=True, kw_only=True)
class ArchVariant:
    """A parsed compilation target: ``sm_90a`` is (vendor nvidia, 9, 0, suffix 'a')."""

    vendor: str
    major: int
    minor: int
    suffix: str = ""
    name: str = ""

    @property
    def cc(self) -> tuple[int, int]:
        return (self.major, self.minor)


def parse_arch(arch: str) -> ArchVariant:
    """Parse ``sm_90a``/``sm_120``/``gfx942`` into numbers; ``ValueError`` if it is neither."""
    text = arch.strip().lower()
    m = _SM_RE.match(text)
    if m:
        return ArchVariant(vendor="nvidia", major=int(m.group(1)), minor=int(m.group(2)),
                           suffix=m.group(3), name=text)
    m = _GFX_RE.match(text)
    if m:
        # gfx942 -> major 9, minor 4 (stepping 2 kept in the name)
        digits = text[3:]
        return ArchVariant(vendor="amd", major=int(digits[:-2]), minor=int(digits[-2], 16),
                           suffix=digits[-1], name=text)
    raise ValueError(f"unrecognised arch variant {arch!r}; expected e.g. 'sm_90a', 'sm_120' or 'gfx942'")


def arch_variant(cc_major: int, cc_minor: int) -> str:
    """The arch variant autoopt targets for an NVIDIA compute capability.

    Hopper and datacenter Blackwell have arch-specific features (WGMMA, tcgen05)
    reachable only through the ``a`` target, so 9.0 -> ``sm_90a`` and 10.x ->
    ``sm_10xa``. Everything else uses the plain target (8.9 -> ``sm_89``).
    """
    base = f"sm_{cc_major}{cc_minor}"
    if (cc_major, cc_minor) == (9, 0) or cc_major in (10, 11):
        return base + "a"
    return base


_NV_GENERATIONS: tuple[tuple[tuple[int, int], tuple[int, int], str], ...] = (
    ((3, 0), (3, 9), "Kepler"),
    ((5, 0), (5, 9), "Maxwell"),
    ((6, 0), (6, 9), "Pascal"),
    ((7, 0), (7, 2), "Volta"),
    ((7, 5), (7, 5), "Turing"),
    ((8, 0), (8, 7), "Ampere"),
    ((8, 9), (8, 9), "Ada"),
    ((9, 0), (9, 0), "Hopper"),
    ((10, 0), (11, 9), "Blackwell"),
    ((12, 0), (12, 9), "Blackwell consumer"),
)


def generation_for(arch: str) -> str:
    """Marketing generation of an arch variant (``sm_90a`` -> ``Hopper``)."""
    try:
        a = parse_arch(arch)
    except ValueError:
        return "unknown"
    if a.vendor == "amd":
        if a.major == 9 and a.minor in (0x4, 0x5):
            return "CDNA3" if a.minor == 0x4 else "CDNA4"
        if a.major == 9 and a.minor == 0:
            return "CDNA2" if a.suffix == "a" else "CDNA"
        if a.major in (11, 12):
            return f"RDNA{a.major - 8}"
        if a.major == 10:
            return "RDNA2" if a.minor >= 3 else "RDNA"
        return "unknown"
    for lo, hi, name in _NV_GENERATIONS:
        if lo <= a.cc <= hi:
            return name
    return "unknown"


@dataclass(frozen=True, slots=True, kw_only=True)
class Features:
    """Capability flags derived from an arch variant (see module docstring for sources)."""

    tensor_cores: bool = False
    bf16: bool = False
    tf32: bool = False
    async_copy: bool = False
    fp8: bool = False
    fp4: bool = False
    tma: bool = False
    clusters: bool = False
    wgmma: bool = False
    tcgen05: bool = False
    mfma: bool = False

    def to_dict(self) -> dict[str, bool]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def names(self) -> tuple[str, ...]:
        """The names of the flags that are on, in declaration order."""
        return tuple(name for name, on in self.to_dict().items() if on)


@lru_cache(maxsize=256)  # GPUProfile.features is read per config while ranking; Features is frozen
def features_for(arch: str) -> Features:
    """Feature flags of an arch variant; an unknown arch gets no features."""
    try:
        a = parse_arch(arch)
    except ValueError:
        return Features()
    if a.vendor == "amd":
        cdna = a.major == 9 and a.minor in (0, 4, 5) and (a.minor != 0 or a.suffix in ("8", "a"))
        return Features(
            tensor_cores=cdna,
            mfma=cdna,
            bf16=cdna or a.major >= 11,
            tf32=a.major == 9 and a.minor == 4,  # xf32 on CDNA3 only
            fp8=a.major == 9 and a.minor >= 4,
        )
    cc = a.cc
    datacenter_blackwell = 10 <= a.major <= 11
    return Features(
        tensor_cores=cc >= (7, 0),
        bf16=cc >= (8, 0),
        tf32=cc >= (8, 0),
        async_copy=cc >= (8, 0),
        fp8=cc >= (8, 9),
        fp4=cc >= (10, 0),
        tma=cc >= (9, 0),
        clusters=cc >= (9, 0),
        wgmma=cc == (9, 0) and a.suffix == "a",
        tcgen05=datacenter_blackwell and a.suffix in ("a", "f"),
    )
