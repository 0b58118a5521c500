"""The known-hardware profile library: one YAML file per device in ``profiles/``.

A file describes one product (``h100-sxm``) or one machine of identical GPUs
(``h100-sxm-8x``): datasheet numbers, the PCI device ids and names the product
shows up under, and the GPU<->GPU interconnect. :func:`load_profile` turns a name
(or a saved profile file) into a :class:`~autoopt.profile.HardwareProfile`;
:func:`match_gpu` finds the entry a detected GPU corresponds to, so detection can
fill in what the driver does not report (peak rates, bandwidth).

Every file goes through the strict schema of :mod:`autoopt._serde`, so a bad
file fails with a :class:`~autoopt.errors.ProfileError` naming file and field.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from autoopt._log import get_logger
from autoopt._paths import profiles_dir
from autoopt._serde import from_plain, to_plain
from autoopt.errors import ProfileError, UnknownProfileError
from autoopt.hardware.features import generation_for, parse_arch
from autoopt.hardware.profile import DTYPES, CPUProfile, GPUProfile, HardwareProfile, Link

__all__ = [
    "Interconnect",
    "KnownDevice",
    "clear_cache",
    "get_known",
    "known_devices",
    "known_names",
    "load_profile",
    "match_gpu",
    "parse_known",
]

log = get_logger(__name__)

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.-]*$")
#: GPU fields a library file must not set: they describe one installed card
#: (index, uuid, bus id, driver), are filled by :meth:`KnownDevice.to_profile`
#: (profile, sources) or are derived on output (features, fingerprint).
_GPU_FORBIDDEN = ("index", "uuid", "pci_bus_id", "profile", "sources", "missing", "driver_version",
                  "memory_free_bytes", "features", "fingerprint")
_VENDOR_BACKENDS = {"nvidia": ("cuda",), "amd": ("rocm",), "intel": ("xpu",)}
_LINK_KINDS = ("nvlink", "xgmi", "pcie")
_TOPOLOGIES = ("switch", "mesh")
_YAML_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True, kw_only=True)
class Interconnect:
    """How the GPUs of a machine profile talk to each other.

    ``bandwidth_gbs`` is per direction per GPU over all its ``links`` (H100 SXM:
    18 NVLink4 links x 25 GB/s = 450 GB/s). ``topology`` says how a pair shares
    them: ``switch`` (NVSwitch: any pair can use every link) or ``mesh`` (direct
    all-to-all wiring: each pair gets ``links / (count - 1)`` of them).
    """

    kind: str
    links: int | None = None
    version: int | None = None
    bandwidth_gbs: float | None = None
    topology: str = "switch"

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Spec:
    """The schema of one library file (checked by ``from_plain``)."""

    name: str
    description: str = ""
    aliases: tuple[str, ...] = ()
    pci_device_ids: tuple[int, ...] = ()
    count: int = 1
    #: a made-up device for exercising constraints (never matched to real hardware).
    virtual: bool = False
    interconnect: Interconnect | None = None
    gpu: dict[str, Any]
    cpu: CPUProfile | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownDevice:
    """One known-hardware profile (one YAML file)."""

    name: str
    description: str = ""
    aliases: tuple[str, ...] = ()
    pci_device_ids: tuple[int, ...] = ()
    count: int = 1
    gpu: GPUProfile
    cpu: CPUProfile | None = None
    interconnect: Interconnect | None = None
    virtual: bool = False
    path: str = ""

    def links(self) -> tuple[Link, ...]:
        """A link between every pair of GPUs, from :attr:`interconnect` (none for one GPU)."""
        ic = self.interconnect
        if ic is None or self.count < 2:
            return ()
        links, bw = ic.links, ic.bandwidth_gbs
        if ic.topology == "mesh":
            peers = self.count - 1
            links = max(1, links // peers) if links else None
            bw = bw / peers if bw is not None else None
        return tuple(Link(a=a, b=b, kind=ic.kind, links=links or 1, bandwidth_gbs=bw)
                     for a in range(self.count) for b in range(a + 1, self.count))

    def to_profile(self) -> HardwareProfile:
        """A :class:`HardwareProfile` with ``count`` GPUs, every filled field sourced ``library``."""
        gpu = self.gpu
        ic = self.interconnect
        if ic is not None and ic.kind == "nvlink":
            gpu = replace(
                gpu,
                nvlink_links=gpu.nvlink_links if gpu.nvlink_links is not None else ic.links,
                nvlink_version=gpu.nvlink_version if gpu.nvlink_version is not None else ic.version,
                nvlink_bandwidth_gbs=(gpu.nvlink_bandwidth_gbs if gpu.nvlink_bandwidth_gbs is not None
                                      else ic.bandwidth_gbs))
        sources = {f.name: "library" for f in dataclasses.fields(GPUProfile)
                   if f.name not in ("index", "profile", "sources", "missing")
                   and _filled(getattr(gpu, f.name))}
        # fresh dicts per GPU: the cached library entry must not change if a caller edits a profile
        gpus = tuple(replace(gpu, index=i, profile=self.name, sources=dict(sources),
                             peak_tflops=dict(gpu.peak_tflops), measured_tflops=dict(gpu.measured_tflops))
                     for i in range(self.count))
        note = f"known-hardware profile {self.name!r}"
        if self.description:
            note += f": {self.description}"
        return HardwareProfile(name=self.name, origin="library", cpu=self.cpu or CPUProfile(),
                               gpus=gpus, links=self.links(), notes=(note,))

    def to_dict(self) -> dict[str, Any]:
        """The file's content (GPU fields that are unset are left out), plus ``path``."""
        gpu = {f.name: to_plain(getattr(self.gpu, f.name)) for f in dataclasses.fields(GPUProfile)
               if f.name not in _GPU_FORBIDDEN and _filled(getattr(self.gpu, f.name))}
        return {
            "name": self.name,
            "description": self.description,
            "aliases": list(self.aliases),
            "pci_device_ids": list(self.pci_device_ids),
            "count": self.count,
            "virtual": self.virtual,
            "interconnect": self.interconnect.to_dict() if self.interconnect else None,
            "gpu": gpu,
            "cpu": self.cpu.to_dict() if self.cpu else None,
            "path": self.path,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> KnownDevice:
        """Inverse of :meth:`to_dict`; validated exactly like a file."""
        if not isinstance(data, Mapping):
            raise ProfileError(f"expected a mapping, got {type(data).__name__}", source=source)
        data = dict(data)
        path = data.pop("path", None)
        if path is not None and not isinstance(path, str):
            raise ProfileError(f"expected a string, got {path!r}", source=source, field="path")
        return _build(data, source=source or path or "<dict>", path=path or source or "")


def _filled(value: Any) -> bool:
    return value is not None and value != "" and value != {} and value != ()


def parse_known(text: str, *, source: str) -> KnownDevice:
    """Parse one known-device YAML file; any problem is a ``ProfileError`` naming ``source``."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except Exception as exc:  # the parser's own failure (syntax, bad tag, bad date) means bad YAML
        raise ProfileError(f"not valid YAML: {_yaml_problem(exc)}", source=source) from None
    if not isinstance(data, Mapping):
        raise ProfileError(f"expected a mapping of fields at the top level, got {type(data).__name__}",
                           source=source)
    return _build(data, source=source, path=source)


def _parse_fast(text: str, *, source: str) -> KnownDevice:
    """:func:`parse_known` through libyaml's parser when PyYAML has it: loading the library goes from
    ~100 ms to ~10 ms (21 files, measured on a 2-core CI box). Text it cannot parse goes through
    parse_known itself, so every error reads exactly as before."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", None)
    if loader is None:
        return parse_known(text, source=source)
    try:
        data = yaml.load(text, Loader=loader)  # CSafeLoader: the safe loader, in C
    except Exception:
        return parse_known(text, source=source)
    if not isinstance(data, Mapping):
        return parse_known(text, source=source)
    return _build(data, source=source, path=source)


def _yaml_problem(exc: Exception) -> str:
    """'mapping values are not allowed here at line 3, column 9' from a PyYAML error."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    if mark is not None:
        problem += f" at line {mark.line + 1}, column {mark.column + 1}"
    return problem


def _build(data: Mapping[str, Any], *, source: str, path: str) -> KnownDevice:
    def err(message: str, where: str) -> ProfileError:
        return ProfileError(message, source=source, field=where)

    spec = from_plain(_Spec, data, err)
    gpu_data = dict(spec.gpu)
    for key in _GPU_FORBIDDEN:
        if key in gpu_data:
            raise err("not allowed in a known-hardware profile (it describes one installed card "
                      "or is filled in when the profile is loaded)", f"gpu.{key}")
    for table in ("peak_tflops", "measured_tflops"):
        rates = gpu_data.get(table)
        if isinstance(rates, Mapping):
            for key in rates:
                if key not in DTYPES:
                    raise err(f"unknown dtype (known: {', '.join(DTYPES)})", f"gpu.{table}.{key}")
    gpu = from_plain(GPUProfile, gpu_data, err, prefix="gpu")
    _check(spec, gpu, err)
    return KnownDevice(name=spec.name, description=spec.description, aliases=spec.aliases,
                       pci_device_ids=spec.pci_device_ids, count=spec.count, gpu=gpu, cpu=spec.cpu,
                       interconnect=spec.interconnect, virtual=spec.virtual, path=path)


#: GPUs in one known machine: an NVL72 rack is the largest one-domain machine sold; a profile
#: claiming more is a typo, and building it (a GPU record each, a link per pair) would not end
MAX_GPUS = 1024


def _check(spec: _Spec, gpu: GPUProfile, err: Any) -> None:
    """Semantic rules the type hints cannot say."""
    if not _NAME_RE.match(spec.name):
        raise err(f"{spec.name!r} must be lowercase letters, digits, '.' and '-' (e.g. 'h100-sxm')", "name")
    if not 1 <= spec.count <= MAX_GPUS:
        raise err(f"must be in 1..{MAX_GPUS} GPUs, got {spec.count}", "count")
    seen: set[str] = set()
    for i, alias in enumerate(spec.aliases):
        key = alias.strip().lower()
        if not key:
            raise err("must not be empty", f"aliases[{i}]")
        if key in seen:
            raise err(f"duplicate alias {alias!r}", f"aliases[{i}]")
        seen.add(key)
    for i, pid in enumerate(spec.pci_device_ids):
        if pid > 0xFFFF:
            raise err(f"a PCI device id is 16 bits, got {pid:#x}", f"pci_device_ids[{i}]")
    ic = spec.interconnect
    if ic is not None:
        if ic.kind not in _LINK_KINDS:
            raise err(f"unknown link kind {ic.kind!r} (known: {', '.join(_LINK_KINDS)})", "interconnect.kind")
        if ic.topology not in _TOPOLOGIES:
            raise err(f"unknown topology {ic.topology!r} (known: {', '.join(_TOPOLOGIES)})",
                      "interconnect.topology")
    for key in ("name", "vendor", "backend", "arch", "generation", "memory_type"):
        value = spec.gpu.get(key)  # as written: GPUProfile fills a blank arch/generation in
        if isinstance(value, str) and not value.strip():
            # a blank string would be written back as "unset" (to_dict leaves unset fields out), so a
            # file that says '' would not round-trip: say "unknown" by leaving the field out
            raise err("must not be empty (leave the field out when it is not known)", f"gpu.{key}")
    backends = _VENDOR_BACKENDS.get(gpu.vendor)
    if backends is None:
        raise err(f"unknown vendor {gpu.vendor!r} (known: {', '.join(_VENDOR_BACKENDS)})", "gpu.vendor")
    if gpu.backend not in backends:
        raise err(f"backend {gpu.backend!r} does not go with vendor {gpu.vendor!r} (expected "
                  f"{' or '.join(backends)})", "gpu.backend")
    if gpu.arch:
        try:
            arch = parse_arch(gpu.arch)
        except ValueError as exc:
            raise err(str(exc), "gpu.arch") from None
        if arch.vendor != gpu.vendor:
            raise err(f"{gpu.arch!r} is an {arch.vendor} arch, but vendor is {gpu.vendor!r}", "gpu.arch")
        if arch.vendor == "nvidia" and gpu.cc is not None and arch.cc != gpu.cc:
            raise err(f"{gpu.arch!r} is compute capability {arch.major}.{arch.minor}, but cc_major/cc_minor "
                      f"say {gpu.cc_major}.{gpu.cc_minor}", "gpu.arch")
        if gpu.generation != generation_for(gpu.arch):
            raise err(f"{gpu.arch!r} is {generation_for(gpu.arch)!r}, not {gpu.generation!r}",
                      "gpu.generation")
    for small, big in (("smem_per_block_optin_bytes", "smem_per_sm_bytes"),
                       ("smem_per_block_bytes", "smem_per_block_optin_bytes"),
                       ("regs_per_block", "regs_per_sm"),
                       ("max_threads_per_block", "max_threads_per_sm"),
                       ("memory_free_bytes", "memory_total_bytes")):
        lo, hi = getattr(gpu, small), getattr(gpu, big)
        if lo is not None and hi is not None and lo > hi:
            raise err(f"{lo} is larger than gpu.{big} ({hi})", f"gpu.{small}")
    if (gpu.cc_major is None) != (gpu.cc_minor is None):
        raise err("give both cc_major and cc_minor, or neither", "gpu.cc_minor")


# --------------------------------------------------------------------------- loading

#: the largest profile file read: the shipped ones are 2-4 KB; anything far bigger is not a profile
MAX_PROFILE_BYTES = 1 << 20


def _read_text(path: Path) -> str:
    """A profile file's text, checked first: a regular file of at most 1 MiB, UTF-8 (never a device,
    a pipe or a huge file, whose read would not end or would fill memory)."""
    import stat

    source = str(path)
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ProfileError("is not a regular file (a device, pipe or socket); expected a .yaml or .json "
                               "profile file", source=source)
        if st.st_size > MAX_PROFILE_BYTES:
            raise ProfileError(f"is {st.st_size} bytes; a profile file is at most {MAX_PROFILE_BYTES} bytes",
                               source=source)
        with path.open("rb") as f:
            data = f.read(MAX_PROFILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(data) > MAX_PROFILE_BYTES:
        raise ProfileError(f"grew past {MAX_PROFILE_BYTES} bytes while being read", source=source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(f"is not UTF-8 text (byte {exc.start}); expected YAML or JSON", source=source) from None


#: the shipped profiles, parsed (see :mod:`autoopt.hardware.yaml_mirror`): a file whose text is in it
#: is built without importing PyYAML (~15 ms of a cold load_profile on a 2-core box)
MIRROR = Path(__file__).resolve().parent / "profiles.mirror.json"


def _load_file(path: Path) -> KnownDevice:
    from autoopt.hardware import yaml_mirror

    source = str(path)
    text = _read_text(path)
    data = yaml_mirror.load(text, path.name, MIRROR)
    dev = _build(data, source=source, path=source) if isinstance(data, Mapping) else _parse_fast(text, source=source)
    if path.stem != dev.name:
        raise ProfileError(f"{dev.name!r} must match the file name ({path.stem!r})", source=source,
                           field="name")
    return dev


def _files_in(entry: Path) -> list[Path]:
    if entry.is_dir():
        return sorted(p for p in entry.iterdir() if p.suffix in _YAML_SUFFIXES and p.is_file())
    if entry.is_file():
        return [entry]
    raise ProfileError("profile directory or file does not exist", source=str(entry))


@lru_cache(maxsize=16)
def _load_all(dirs: tuple[str, ...]) -> tuple[KnownDevice, ...]:
    devices: list[KnownDevice] = []
    by_name: dict[str, KnownDevice] = {}
    by_alias: dict[str, KnownDevice] = {}
    for entry in dirs:
        for path in _files_in(Path(entry)):
            dev = _load_file(path)
            if dev.name in by_name:
                raise ProfileError(f"duplicate profile name {dev.name!r} (also in {by_name[dev.name].path})",
                                   source=dev.path, field="name")
            for alias in (dev.name, *dev.aliases):
                key = _norm(alias)
                other = by_alias.get(key)
                if other is not None and other is not dev:
                    raise ProfileError(f"{alias!r} already names {other.name!r} ({other.path})",
                                       source=dev.path, field="aliases")
                by_alias[key] = dev
            by_name[dev.name] = dev
            devices.append(dev)
    log.debug("loaded %d known-hardware profiles from %s", len(devices), dirs)
    return tuple(devices)


def _dirs(extra_dirs: Iterable[Path | str]) -> tuple[str, ...]:
    if isinstance(extra_dirs, (str, Path)):
        extra_dirs = (extra_dirs,)
    return (str(profiles_dir()), *(str(Path(d).expanduser().resolve()) for d in extra_dirs))


def known_devices(extra_dirs: Iterable[Path | str] = ()) -> tuple[KnownDevice, ...]:
    """Every shipped profile, then those in ``extra_dirs`` (folders or files); cached."""
    return _load_all(_dirs(extra_dirs))


def clear_cache() -> None:
    """Forget loaded profiles (after editing a profile file in a running process)."""
    _load_all.cache_clear()
    _SHIPPED.clear()


_SHIPPED: dict[str, KnownDevice] = {}


def _shipped(name: str) -> KnownDevice | None:
    """The shipped profile called exactly ``name``, parsed from its own file alone (None: no such file).

    A name equals its file's stem (checked on load) and stems are unique in one folder, so this is
    the device :func:`known_devices` would find by that name; parsing 1 file instead of 21 saves
    ~10 ms of a cold ``load_profile`` (2-core box). The other files are checked when something
    reads the whole library (aliases, matching, listing)."""
    key = name.strip().lower()
    dev = _SHIPPED.get(key)
    if dev is None and _NAME_RE.match(key):
        folder = profiles_dir()
        files = [f for f in (folder / f"{key}{suffix}" for suffix in _YAML_SUFFIXES) if f.is_file()]
        if len(files) != 1:
            return None  # none (an alias, or unknown), or two: the full load words it
        dev = _SHIPPED[key] = _load_file(files[0])
    return dev


def known_names(extra_dirs: Iterable[Path | str] = ()) -> tuple[str, ...]:
    return tuple(d.name for d in known_devices(extra_dirs))


def _lookup(name: str, devices: tuple[KnownDevice, ...]) -> KnownDevice | None:
    key = name.strip().lower()
    for dev in devices:
        if dev.name == key:
            return dev
    key = _norm(name)
    for dev in devices:
        if key in {_norm(a) for a in dev.aliases}:
            return dev
    return None


def get_known(name: str, extra_dirs: Iterable[Path | str] = ()) -> KnownDevice:
    """The device called ``name`` (or one of its aliases); ``UnknownProfileError`` with suggestions."""
    devices = known_devices(extra_dirs)
    dev = _lookup(name, devices)
    if dev is not None:
        return dev
    owner: dict[str, str] = {}
    for d in devices:
        for label in (d.name, *d.aliases):
            owner.setdefault(label.lower(), d.name)
    import difflib  # only for an unknown name: not at import (~1.5 ms)

    suggestions: list[str] = []
    for hit in difflib.get_close_matches(name.strip().lower(), list(owner), n=6, cutoff=0.6):
        if owner[hit] not in suggestions:
            suggestions.append(owner[hit])
    raise UnknownProfileError(name, suggestions[:3])


def _looks_like_path(text: str) -> bool:
    return "/" in text or "\\" in text or text.lower().endswith((*_YAML_SUFFIXES, ".json"))


def load_profile(name_or_path: str | Path, extra_dirs: Iterable[Path | str] = ()) -> HardwareProfile:
    """A known device by name, or a profile file (known-device YAML or a saved HardwareProfile)."""
    if isinstance(name_or_path, str):
        if not name_or_path.strip():
            raise UnknownProfileError(name_or_path)
        if isinstance(extra_dirs, (tuple, list)) and not extra_dirs:
            dev = _shipped(name_or_path)
            if dev is not None:
                return dev.to_profile()
        devices = known_devices(extra_dirs)
        dev = _lookup(name_or_path, devices)
        if dev is not None:
            return dev.to_profile()
        if not _looks_like_path(name_or_path) and not Path(name_or_path).exists():
            return get_known(name_or_path, extra_dirs).to_profile()  # raises with suggestions
    return _load_path(Path(name_or_path))


def _load_path(path: Path) -> HardwareProfile:
    source = str(path)
    if not path.exists():
        raise ProfileError("no such profile file (give a known profile name or an existing "
                           ".yaml/.json file)", source=source)
    if path.is_dir():
        raise ProfileError("is a directory; expected a .yaml or .json profile file", source=source)
    text = _read_text(path)
    if path.suffix.lower() == ".json":
        import json

        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ProfileError(f"not valid JSON: {exc}", source=source) from None
    else:
        import yaml

        try:
            data = yaml.safe_load(text)
        except Exception as exc:  # the parser's own failure means bad YAML
            raise ProfileError(f"not valid YAML: {_yaml_problem(exc)}", source=source) from None
    if isinstance(data, Mapping) and "gpus" in data:
        return HardwareProfile.from_dict(data, source=source)
    if isinstance(data, Mapping) and "gpu" in data:
        return _build(data, source=source, path=source).to_profile()
    raise ProfileError("neither a known-device profile (has key 'gpu') nor a saved hardware profile "
                       "(has key 'gpus', as written by `autoopt profile --save`)", source=source)


# --------------------------------------------------------------------------- matching

_NOISE_TOKENS = frozenset({"nvidia", "amd", "geforce", "tensor", "core", "gpu", "instinct", "graphics",
                           "hbm2", "hbm2e", "hbm3", "hbm3e", "gddr6", "gddr6x", "gddr7"})
_MEM_TOKEN = re.compile(r"^\d+gb$")


def _norm(text: str) -> str:
    """Lowercase, single spaces, without a leading vendor word ('NVIDIA H100' -> 'h100')."""
    out = " ".join(text.lower().split())
    for prefix in ("nvidia ", "amd "):
        if out.startswith(prefix):
            out = out[len(prefix):]
    return out


def _tokens(text: str) -> frozenset[str]:
    """Model-defining words of a name: vendor/marketing words and memory sizes dropped."""
    words = re.split(r"[\s\-_/(),]+", text.lower())
    return frozenset(w for w in words if w and w not in _NOISE_TOKENS and not _MEM_TOKEN.match(w))


def _labels(dev: KnownDevice) -> tuple[str, ...]:
    return (dev.name, dev.gpu.name, *dev.aliases)


def _by_memory(cands: list[KnownDevice], memory_total_bytes: int | None) -> KnownDevice:
    if memory_total_bytes is None or len(cands) == 1:
        return cands[0]

    def distance(dev: KnownDevice) -> float:
        mem = dev.gpu.memory_total_bytes
        return abs(mem - memory_total_bytes) if mem is not None else float("inf")

    return min(cands, key=distance)


def match_gpu(*, name: str | None = None, pci_device_id: int | None = None,
              cc: tuple[int, int] | None = None, memory_total_bytes: int | None = None,
              extra_dirs: Iterable[Path | str] = ()) -> KnownDevice | None:
    """The single-GPU known device a detected GPU is, or ``None``.

    Tried in order: PCI device id (one product can carry several marketing names,
    and names are shared across products); exact name or alias (case-insensitive,
    without the vendor word); then same compute capability and a name whose
    model-defining words agree (``"NVIDIA A100-SXM4"`` fits both A100 SXM4 sizes,
    ``"RTX 3060 Ti"`` does not fit ``rtx-3060``). Memory size decides between
    candidates (A100 40 vs 80 GB). Virtual and multi-GPU profiles never match.
    """
    devices = [d for d in known_devices(extra_dirs) if d.count == 1 and not d.virtual]
    if pci_device_id is not None:
        # NVML packs device and vendor id into 32 bits (0x233010DE = device 0x2330, vendor 0x10DE)
        pid = pci_device_id >> 16 if pci_device_id > 0xFFFF else pci_device_id
        hits = [d for d in devices if pid in d.pci_device_ids]
        if hits:
            return _by_memory(hits, memory_total_bytes)
    if name:
        key = _norm(name)
        hits = [d for d in devices if key in {_norm(label) for label in _labels(d)}]
        if hits:
            return _by_memory(hits, memory_total_bytes)
        if cc is not None:
            import difflib

            want = _tokens(key)
            scored: list[tuple[float, KnownDevice]] = []
            for d in devices:
                if d.gpu.cc != tuple(cc) or not want:
                    continue
                if any(_tokens(label) == want for label in _labels(d)):
                    ratio = max(difflib.SequenceMatcher(None, key, _norm(label)).ratio()
                                for label in _labels(d))
                    scored.append((ratio, d))
            if scored:
                scored.sort(key=lambda item: -item[0])
                return _by_memory([d for _, d in scored], memory_total_bytes)
    return None
