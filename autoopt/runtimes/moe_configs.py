"""The fused-MoE kernel config files vLLM and SGLang read at start-up, as data: their names, folders,
JSON and the MoE layer shard they describe; and writing them (atomically, never over a stranger's file).

Both runtimes run every MoE layer through one Triton kernel (``fused_moe_kernel``) whose tile config
comes from a JSON file named for the layer shard and the GPU::

    E={E},N={N},device_name={device}[,dtype={selector}][,block_shape=[{bn},{bk}]].json

mapping token counts M to ``BLOCK_SIZE_M/N/K``, ``GROUP_SIZE_M``, ``num_warps``, ``num_stages``; the
runtime takes the entry whose M is nearest the batch's. What each part means (sources below):

- ``E``: experts on one GPU (``w2.shape[0]``); ``N``: the intermediate size on one GPU, the logical
  one. vLLM reads ``w2.shape[2]`` and doubles it for ``int4_w4a16`` (two 4-bit values a byte), which
  gives the logical size back; both runtimes' tuners name files by the logical size, so this module
  always writes the logical ``N`` (SGLang does not double at load: an int4_w4a16 file there is named
  as its tuner names it, which its loader may not find; unchecked on SGLang);
- ``device``: ``torch.cuda.get_device_name()`` (NVML's name under vLLM's NVML platform: the same
  string, /work/shared/hardware-captures/h100/probe.txt), made a file name: vLLM replaces each run of
  whitespace or ``/`` with ``_`` and names any GPU with an ``H200`` token ``NVIDIA_H200``; SGLang
  replaces each space with ``_``. The name comes from the profile's ``gpu.name``, which the library
  keeps as torch/NVML report it (profiles/h100-sxm.yaml, h200.yaml);
- ``dtype``: absent for bf16/fp16; ``fp8_w8a8``, ``fp8_w8a16``, ``int8_w8a16``, ``int4_w4a16`` (vLLM,
  SGLang), ``int8_w8a8`` (SGLang only: vLLM 0.33 names no selector for it);
- ``block_shape``: only for block-quantized weights with both sides non-zero: vLLM writes
  ``[128,128]``, SGLang ``[128, 128]`` (Python's list repr); SGLang adds ``,per_channel_quant=True``
  for per-channel quantization.

Folders: vLLM reads ``$VLLM_TUNED_CONFIG_FOLDER/<name>`` before its shipped configs; SGLang reads
``$SGLANG_MOE_CONFIG_DIR/configs/triton_<x_y_z>/<name>`` for the running Triton's version (then the
other version folders there, newest first). JSON: the M keys only; vLLM also pops an optional
``"triton_version"`` key, SGLang does not (it calls ``int()`` on every key), and neither takes any
other key, so where each entry came from (predicted or measured) goes in a sidecar file
``<name minus .json>.autoopt.json`` beside it, which no runtime reads.

Sources (read for semantics, nothing copied): vLLM 0.33 ``model_executor/layers/fused_moe/fused_moe.py``
(``get_config_file_name``, ``get_moe_configs``, ``try_get_optimal_moe_config``), ``config.py``
(``_get_config_dtype_str``, ``FusedMoEParallelConfig.make``), ``expert_map_manager.py``
(``determine_expert_map``), ``utils/platform_utils.py`` (``get_device_name_as_file_name``),
``envs.py`` (``VLLM_TUNED_CONFIG_FOLDER``); SGLang ``python/sglang/srt/layers/moe/fused_moe_triton/
fused_moe_triton_config.py`` (``get_config_file_name``, ``get_moe_configs``: ``SGLANG_MOE_CONFIG_DIR``,
``triton_{version}``) and ``benchmark/kernels/fused_moe_triton/common_utils.py``
(``calculate_shard_intermediate_size``, ``get_default_batch_sizes``).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoopt._files import write_atomic
from autoopt.errors import ExportError, RuntimeRuleError

__all__ = ["CONFIG_KEYS", "ENV_VARS", "M_VALUES", "RUNTIMES", "ConfigFileName", "MoeEntry", "MoeShard",
           "Written", "config_folder", "device_file_name", "file_name", "moe_shards", "nearest_m",
           "parse_file_name", "render_json", "sidecar_name", "write_configs"]

RUNTIMES = ("vllm", "sglang")
#: the token counts both runtimes' tuners write (vLLM benchmarks/kernels/benchmark_moe.py's batch sizes;
#: SGLang common_utils.get_default_batch_sizes): the runtime takes the entry nearest a batch's M
M_VALUES: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)
#: one entry's keys, in the order the runtimes' tuners write them
CONFIG_KEYS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps", "num_stages")
#: the variable that points each runtime at a folder of config files
ENV_VARS = {"vllm": "VLLM_TUNED_CONFIG_FOLDER", "sglang": "SGLANG_MOE_CONFIG_DIR"}
#: the weight/activation formats (the runtimes' selector names) each runtime has a file selector for;
#: bf16/fp16 have none. vLLM's _get_config_dtype_str has no int8_w8a8 branch (None: the 16-bit name).
_SELECTORS: dict[str, tuple[str, ...]] = {
    "vllm": ("fp8_w8a8", "fp8_w8a16", "int8_w8a16", "int4_w4a16"),
    "sglang": ("fp8_w8a8", "int8_w8a8", "int8_w8a16", "int4_w4a16"),
}
DTYPES = ("bf16", "fp16", "fp8_w8a8", "fp8_w8a16", "int8_w8a8", "int8_w8a16", "int4_w4a16")
#: the sidecar's suffix (replaces ``.json``)
_SIDECAR = ".autoopt.json"
_GENERATOR = "autoopt"
_NAME_RE = re.compile(r"E=(?P<E>[1-9]\d*),N=(?P<N>[1-9]\d*),device_name=(?P<device>[^,]+?)"
                      r"(?:,dtype=(?P<dtype>[a-z0-9_]+))?(?:,block_shape=\[(?P<bn>[1-9]\d*),( ?)(?P<bk>[1-9]\d*)\])?"
                      r"(?P<pc>,per_channel_quant=True)?\.json")


def _runtime(runtime: str) -> str:
    name = str(runtime).strip().lower()
    if name not in RUNTIMES:
        raise RuntimeRuleError(f"has no fused-MoE config files autoopt writes; expected one of {', '.join(RUNTIMES)}",
                               runtime=str(runtime), rule="moe-configs")
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeShard:
    """The MoE layer as one GPU runs it: what a config file is named for (validated on construction)."""

    experts: int                          # E: experts on this GPU
    intermediate: int                     # N: intermediate size on this GPU (logical; w2.shape[2] unpacked)
    hidden: int                           # K: the model's hidden size
    topk: int                             # experts per token
    dtype: str = "bf16"                   # bf16, fp16 or a quantized format's selector (DTYPES)
    block_shape: tuple[int, int] | None = None  # [block_n, block_k] of block-quantized weights
    per_channel: bool = False             # per-channel quantization (SGLang names it)
    act_dtype: str = "bf16"               # activations of a quantized format (bf16/fp16)
    tp: int = 1                           # the MoE layer's tensor-parallel degree (splits N)
    ep: int = 1                           # its expert-parallel degree (splits E)

    def __post_init__(self) -> None:
        for name in ("experts", "intermediate", "hidden", "topk", "tp", "ep"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise RuntimeRuleError(f"MoE shard: {name} must be a positive integer, got {v!r}", rule="moe-shard")
        if self.dtype not in DTYPES:
            raise RuntimeRuleError(f"MoE shard: unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}",
                                   rule="moe-shard")
        if self.dtype in ("bf16", "fp16"):
            object.__setattr__(self, "act_dtype", self.dtype)
        elif self.act_dtype not in ("bf16", "fp16"):
            raise RuntimeRuleError(f"MoE shard: activations of {self.dtype} are bf16 or fp16, got {self.act_dtype!r}",
                                   rule="moe-shard")
        if self.block_shape is not None:
            bs = tuple(self.block_shape)
            if len(bs) != 2 or any(isinstance(b, bool) or not isinstance(b, int) or b < 0 for b in bs):
                raise RuntimeRuleError(f"MoE shard: block_shape must be two non-negative integers [block_n, block_k], "
                                       f"got {self.block_shape!r}", rule="moe-shard")
            if not self.dtype.startswith(("fp8", "int8_w8a8")) and all(bs):
                raise RuntimeRuleError(f"MoE shard: a block_shape names block-quantized fp8/int8 weights, not "
                                       f"{self.dtype}", rule="moe-shard")
            object.__setattr__(self, "block_shape", bs if all(bs) else None)
        if self.topk > self.experts * self.ep:
            raise RuntimeRuleError(f"MoE shard: top-{self.topk} routing needs at least {self.topk} experts in all, "
                                   f"got {self.experts} x ep {self.ep}", rule="moe-shard")

    def to_dict(self) -> dict[str, Any]:
        return {"experts": self.experts, "intermediate": self.intermediate, "hidden": self.hidden,
                "topk": self.topk, "dtype": self.dtype,
                "block_shape": list(self.block_shape) if self.block_shape else None,
                "per_channel": self.per_channel, "act_dtype": self.act_dtype, "tp": self.tp, "ep": self.ep}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MoeShard:
        bs = data.get("block_shape")
        return cls(experts=data["experts"], intermediate=data["intermediate"], hidden=data["hidden"],
                   topk=data["topk"], dtype=data.get("dtype", "bf16"),
                   block_shape=(int(bs[0]), int(bs[1])) if bs else None, per_channel=bool(data.get("per_channel")),
                   act_dtype=data.get("act_dtype", "bf16"), tp=data.get("tp", 1), ep=data.get("ep", 1))


def moe_shards(runtime: str, *, experts: int, intermediate: int, hidden: int, topk: int, tp: int = 1, ep: int = 1,
               dtype: str = "bf16", block_shape: tuple[int, int] | None = None, per_channel: bool = False,
               act_dtype: str = "bf16") -> tuple[MoeShard, ...]:
    """The distinct shards a MoE layer of ``experts`` x ``intermediate`` becomes under ``runtime`` with
    ``tp``/``ep`` (one, or two when the experts do not split evenly: ranks hold E//ep + 1 and E//ep).

    - vLLM (``FusedMoEParallelConfig.make``): with expert parallelism on (``--enable-expert-parallel``)
      the MoE layer's EP degree is TP x DP and its TP degree 1: experts split, N whole; off, N splits
      over TP x DP. Here ``ep`` > 1 asks for EP and must be ``tp`` times a data-parallel degree, and the
      shard's N is then unsplit; ``determine_expert_map`` gives the first E % ep ranks one expert more.
    - SGLang (``calculate_shard_intermediate_size``): MoE TP = ``tp // ep`` (``tp % ep == 0``), N splits
      over it and E over ``ep``.

    N must split evenly (both runtimes assert it), and under a block shape into whole blocks.
    """
    rt = _runtime(runtime)
    for name, v in (("tp", tp), ("ep", ep), ("experts", experts), ("intermediate", intermediate)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise RuntimeRuleError(f"{name} must be a positive integer, got {v!r}", runtime=rt, rule="moe-shard")
    if rt == "vllm":
        if ep > 1 and ep % tp:
            raise RuntimeRuleError(f"expert parallelism spans TP x DP GPUs, so ep ({ep}) must be a multiple of tp "
                                   f"({tp})", runtime=rt, rule="moe-shard")
        moe_tp = 1 if ep > 1 else tp
    else:
        if tp % ep:
            raise RuntimeRuleError(f"the MoE layer's TP degree is tp // ep, so ep ({ep}) must divide tp ({tp})",
                                   runtime=rt, rule="moe-shard")
        moe_tp = tp // ep
    if ep > experts:
        raise RuntimeRuleError(f"{experts} experts cannot spread over ep={ep} GPUs", runtime=rt, rule="moe-shard")
    if intermediate % moe_tp:
        raise RuntimeRuleError(f"the intermediate size {intermediate} does not split over the MoE layer's TP degree "
                               f"{moe_tp}; pick a degree that divides it", runtime=rt, rule="moe-shard")
    n = intermediate // moe_tp
    if block_shape is not None and all(block_shape) and n % block_shape[0]:
        raise RuntimeRuleError(f"N={n} per GPU is not a whole number of {block_shape[0]}-wide weight blocks; "
                               "pick a smaller tp", runtime=rt, rule="moe-shard")
    counts = sorted({experts // ep + (1 if experts % ep else 0), experts // ep}, reverse=True)
    return tuple(MoeShard(experts=e, intermediate=n, hidden=hidden, topk=topk, dtype=dtype, block_shape=block_shape,
                          per_channel=per_channel, act_dtype=act_dtype, tp=moe_tp, ep=ep) for e in counts if e)


def device_file_name(gpu_name: str, runtime: str) -> str:
    """``gpu_name`` (as torch.cuda.get_device_name() reports it) as ``runtime`` writes it in file names."""
    rt = _runtime(runtime)
    name = str(gpu_name).strip()
    if not name:
        raise RuntimeRuleError("the GPU has no name to write in a config file name", runtime=rt, rule="device")
    if rt == "sglang":
        return name.replace(" ", "_")
    name = re.sub(r"[\s/]+", "_", name)
    # vLLM: any device of the H200 family reads the NVIDIA_H200 files
    return "NVIDIA_H200" if "H200" in name.split("_") else name


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigFileName:
    """What a config file name says (the parts, as written)."""

    experts: int
    intermediate: int
    device: str
    dtype: str | None = None
    block_shape: tuple[int, int] | None = None
    per_channel: bool = False

    def render(self, runtime: str) -> str:
        """The name as ``runtime`` writes it (see the module docstring)."""
        rt = _runtime(runtime)
        if self.dtype is not None and self.dtype not in _SELECTORS[rt]:
            raise RuntimeRuleError(f"names no config files for {self.dtype}; its formats: "
                                   f"bf16, fp16, {', '.join(_SELECTORS[rt])}", runtime=rt, rule="dtype")
        if self.per_channel and rt != "sglang":
            raise RuntimeRuleError("has no per-channel config files (one fp8_w8a8 file serves every fp8 scale "
                                   "layout)", runtime=rt, rule="dtype")
        name = f"E={self.experts},N={self.intermediate},device_name={self.device}"
        if self.dtype:
            name += f",dtype={self.dtype}"
        if self.block_shape and all(self.block_shape):
            sep = "," if rt == "vllm" else ", "
            name += f",block_shape=[{self.block_shape[0]}{sep}{self.block_shape[1]}]"
        if self.per_channel:
            name += ",per_channel_quant=True"
        return name + ".json"


def _selector(shard: MoeShard) -> str | None:
    return None if shard.dtype in ("bf16", "fp16") else shard.dtype


def file_name(runtime: str, shard: MoeShard, gpu_name: str) -> str:
    """The file ``runtime`` looks for when it runs ``shard`` on the GPU called ``gpu_name``."""
    return ConfigFileName(experts=shard.experts, intermediate=shard.intermediate,
                          device=device_file_name(gpu_name, runtime), dtype=_selector(shard),
                          block_shape=shard.block_shape, per_channel=shard.per_channel).render(runtime)


def parse_file_name(name: str) -> ConfigFileName:
    """The parts of a config file name either runtime writes (a path's last part is read); a
    :class:`RuntimeRuleError` for anything else (a sidecar, SGLang's ``_down`` files, another file)."""
    base = Path(str(name)).name
    m = _NAME_RE.fullmatch(base)
    if m is None or base.endswith(_SIDECAR):
        raise RuntimeRuleError(f"{base!r} is not a fused-MoE config file name (E=<experts>,N=<size>,"
                               "device_name=<gpu>[,dtype=<fmt>][,block_shape=[<n>,<k>]].json)", rule="file-name")
    dtype = m["dtype"]
    if dtype is not None and dtype not in DTYPES:
        raise RuntimeRuleError(f"{base!r}: unknown dtype selector {dtype!r}", rule="file-name")
    bs = (int(m["bn"]), int(m["bk"])) if m["bn"] else None
    return ConfigFileName(experts=int(m["E"]), intermediate=int(m["N"]), device=m["device"], dtype=dtype,
                          block_shape=bs, per_channel=bool(m["pc"]))


def sidecar_name(config_name: str) -> str:
    """The provenance file beside a config file: ``<name minus .json>.autoopt.json``."""
    return config_name.removesuffix(".json") + _SIDECAR


def config_folder(runtime: str, out: str | Path, triton_version: str | None = None) -> Path:
    """Where in ``out`` (the folder the runtime's variable points at) ``runtime`` reads config files:
    ``out`` itself (vLLM), ``out/configs/triton_<x_y_z>`` (SGLang; the Triton version is required)."""
    rt = _runtime(runtime)
    base = Path(out)
    if rt == "vllm":
        return base
    if not triton_version or not re.fullmatch(r"\d+\.\d+\.\d+", triton_version):
        raise RuntimeRuleError(f"reads config files per Triton version (configs/triton_<x_y_z>); give the version "
                               f"the server runs as x.y.z, got {triton_version!r}", runtime=rt, rule="triton")
    return base / "configs" / f"triton_{triton_version.replace('.', '_')}"


def nearest_m(m: int, keys: tuple[int, ...] = M_VALUES) -> int:
    """The key the runtimes use for a batch of ``m`` tokens: the nearest, the smaller on a tie
    (``min(keys, key=|k - m|)`` over keys in ascending order, as both runtimes do)."""
    return min(sorted(keys), key=lambda k: abs(k - m))


@dataclass(frozen=True, slots=True, kw_only=True)
class MoeEntry:
    """One M's config and where it came from: ``predicted`` (the cost model) or ``measured`` (timed here)."""

    params: Mapping[str, int]
    label: str = "predicted"
    predicted_us: float | None = None
    measured_us: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.label not in ("predicted", "measured"):
            raise RuntimeRuleError(f"an entry is 'predicted' or 'measured', got {self.label!r}", rule="moe-entry")
        missing = [k for k in CONFIG_KEYS if k not in self.params]
        extra = [k for k in self.params if k not in CONFIG_KEYS]
        bad = [k for k in CONFIG_KEYS if k in self.params
               and (isinstance(self.params[k], bool) or not isinstance(self.params[k], int) or self.params[k] < 1)]
        if missing or extra or bad:
            raise RuntimeRuleError(f"a fused-MoE config has exactly {', '.join(CONFIG_KEYS)} as positive integers; "
                                   f"missing {missing}, unknown {extra}, not positive integers {bad}",
                                   rule="moe-entry")
        object.__setattr__(self, "params", {k: int(self.params[k]) for k in CONFIG_KEYS})

    def to_dict(self) -> dict[str, Any]:
        return {"config": dict(self.params), "label": self.label, "predicted_us": self.predicted_us,
                "measured_us": self.measured_us, "source": self.source}


def render_json(runtime: str, entries: Mapping[int, MoeEntry], *, triton_version: str | None = None) -> str:
    """The config file's text: M keys ascending, each entry's keys in :data:`CONFIG_KEYS` order; vLLM's
    file also carries ``triton_version`` first when one is given (SGLang's never: it parses every key as M)."""
    rt = _runtime(runtime)
    if not entries:
        raise RuntimeRuleError("a config file needs at least one M entry", runtime=rt, rule="moe-entry")
    data: dict[str, Any] = {}
    if rt == "vllm" and triton_version:
        data["triton_version"] = triton_version
    for m in sorted(entries):
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise RuntimeRuleError(f"M keys are positive token counts, got {m!r}", runtime=rt, rule="moe-entry")
        data[str(m)] = {k: entries[m].params[k] for k in CONFIG_KEYS}
    return json.dumps(data, indent=4) + "\n"


@dataclass(frozen=True, slots=True, kw_only=True)
class Written:
    """One config file written, its sidecar, and how many entries were measured vs predicted."""

    path: Path
    sidecar: Path
    measured: int
    predicted: int
    replaced: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "sidecar": str(self.sidecar), "measured": self.measured,
                "predicted": self.predicted, "replaced": self.replaced}


#: a sidecar holds 18 entries of a few hundred bytes; anything far larger is not one of ours
_MAX_SIDECAR_BYTES = 1 << 20


def _ours(sidecar: Path) -> bool:
    """Whether ``sidecar`` is autoopt's: a regular file (a FIFO or a device would block or never end) of a
    sane size holding autoopt's JSON."""
    try:
        st = sidecar.stat()
        if not stat.S_ISREG(st.st_mode) or st.st_size > _MAX_SIDECAR_BYTES:
            return False
        data = json.loads(sidecar.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("generator") == _GENERATOR


def _folder(folder: Path) -> None:
    """Create ``folder`` (and its parents), or say why it cannot be one."""
    for p in (folder, *folder.parents):
        if p.exists() and not p.is_dir():
            raise ExportError("is a file, not a folder; give --out a folder path", path=str(p))
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ExportError(f"cannot create the folder ({exc.strerror or exc}); give --out a writable folder",
                          path=str(folder)) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ExportError("the folder is not writable; give --out a writable folder", path=str(folder))


def write_configs(runtime: str, shard: MoeShard, gpu_name: str, entries: Mapping[int, MoeEntry], out: str | Path,
                  *, triton_version: str | None = None, force: bool = False,
                  provenance: Mapping[str, Any] | None = None) -> Written:
    """Write ``runtime``'s config file for ``shard`` on ``gpu_name`` into ``out`` (the folder its variable
    points at; SGLang's version subfolder is made), and its sidecar.

    A file already there is replaced when its sidecar says autoopt wrote it; anything else (a runtime's
    shipped file, a tuner's output) only with ``force`` (:class:`ExportError` otherwise: a hand-tuned file
    is someone's hours). The sidecar is written first, so a failure leaves no config without provenance.
    """
    rt = _runtime(runtime)
    folder = config_folder(rt, out, triton_version)
    name = file_name(rt, shard, gpu_name)
    text = render_json(rt, entries, triton_version=triton_version)
    _folder(folder)
    path, side = folder / name, folder / sidecar_name(name)
    replaced = path.exists() or path.is_symlink()
    if replaced:
        if path.is_dir():
            raise ExportError("is a folder where the config file goes; remove it or give --out another folder",
                              path=str(path))
        if not force and not _ours(side):
            raise ExportError("exists and autoopt did not write it (no autoopt sidecar beside it); keep it, give "
                              "--out another folder, or pass --force to replace it", path=str(path))
    labels = [e.label for e in entries.values()]
    meta = {"generator": _GENERATOR, "runtime": rt, "file": name, "device_name": gpu_name, "shard": shard.to_dict(),
            "triton_version": triton_version, **(provenance or {}),
            "entries": {str(m): entries[m].to_dict() for m in sorted(entries)}}
    try:
        write_atomic(side, json.dumps(meta, indent=2) + "\n")
        write_atomic(path, text)
    except OSError as exc:
        raise ExportError(f"cannot write ({exc.strerror or exc})", path=str(path)) from None
    return Written(path=path, sidecar=side, measured=labels.count("measured"), predicted=labels.count("predicted"),
                   replaced=replaced)
