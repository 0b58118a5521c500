"""The shipped rank cache: the cost model's best config per op for the built-in GPUs, computed once.

A cold :func:`autoopt.recommend` ranks ~20 distinct ops; branch and bound over the templates'
spaces costs ~40-100 ms of it on a 2-core box, the largest single part of the first call a runtime
pays at start-up. The answer depends only on the GPU, the op, the templates and the cost model, so
``benchmarks/regen_startup_cache.py`` (:func:`autoopt.planning.startup.regenerate`) ranks every op
that ``recommend()`` asks about for every built-in profile x catalog model x runtime x preference
(default workload) and ships the winners here, one file per GPU in ``search/shipped/``.

:func:`best` answers ``rank(gpu, op).candidates[0]`` (or the error ``rank`` raises) from that file
when it can, and ``None`` when it cannot, so the caller ranks as before. An answer is given only
when everything that decides a ranking is what the file was built with, checked on every use:

- the GPU: every field the templates and the cost model read (:func:`~autoopt.kernels.pruning.gpu_key`,
  kept in the file in full, not hashed);
- the code: a CRC-32 of each built-in template source, of ``autoopt/kernels/*.py``, of
  ``search/ranking.py`` and of ``hardware/{features,profile}.py``, plus autoopt's version and
  :data:`VERSION` (this file's format);
- the cost constants in effect (explicit ones, else the device's calibrated ones, else the defaults);
- the templates: only the built-in ones, by name (a plugin's template could win an op).

Anything else, and any file that is not a regular file of sane size in this format, is ignored
with one log line per file and reason (never an exception: a cache must not break start-up).
A measured winner in the results store still comes first, as in ``rank``: when the store names
the cached config, it is labelled measured; when it names another config, ``best`` answers with
that config's learned prediction, or ``None`` and ``rank`` decides.

**Learned answers.** What ``rank`` answers on this machine for an op the shipped file lacks (a
model outside the catalog, another workload) or for a measured winner's config is kept in a file
of the same format in the cache folder's ``ranks/`` (:func:`learn`, :func:`flush`; ``recommend()``
flushes once at its end), checked on use like the shipped file: a runtime's second start-up with
a custom model, or on a tuned machine, ranks nothing. ``AUTOOPT_CACHE_DIR=off`` keeps nothing.

File format (zlib-compressed UTF-8 text, one JSON document per line): a header
``{"format": "autoopt-rank-cache", "version": 1, "gpu": "<repr of gpu_key>", "gpu_name": ...,
"autoopt_version": ..., "sources": {"templates/gemm.py": "<crc32>", ...}, "constants": {...},
"templates": [...], "entries": N}``, then one line per op: ``<op key>`` TAB ``<entry JSON>``
(``op key``: kind, shape, dtype, layout, out_dtype, weight format if any; entry: the candidate's config, prediction,
bound, roofline share, reason and breakdown with exact floats, or ``{"error": ...}``). Lines are
decoded only when their op is asked for.
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoopt._files import write_atomic
from autoopt._log import get_logger
from autoopt.errors import AutooptError, ConfigError, OpError
from autoopt.hardware.profile import GPUProfile
from autoopt.kernels.config import Candidate, KernelConfig
from autoopt.kernels.ops import OpSpec

if TYPE_CHECKING:
    from autoopt.kernels.constants import CostConstants

log = get_logger(__name__)

__all__ = ["FORMAT", "MAX_FILE_BYTES", "MAX_LEARNED", "SHIPPED_DIR", "VERSION", "best", "clear_cache",
           "code_sources", "file_for", "flush", "learn", "op_key", "write"]

FORMAT = "autoopt-rank-cache"
#: bump when the file layout or what an entry means changes (old files are then ignored)
VERSION = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"
SUFFIX = ".ranks"
#: a compressed file is ~20-80 KB (one GPU, ~200-600 ops); far larger is not one of ours
MAX_FILE_BYTES = 4 << 20
#: and its text ~0.1-0.5 MB: decompression stops past this (a zlib bomb is refused, not inflated)
MAX_TEXT_BYTES = 32 << 20
_ERRORS: dict[str, type[AutooptError]] = {"ConfigError": ConfigError, "OpError": OpError,
                                          "AutooptError": AutooptError}
_SLUG = re.compile(r"[^a-z0-9]+")
#: the template sources count; plus these, relative to the autoopt package folder
_PACKAGE_SOURCES = ("kernels/*.py", "search/ranking.py", "hardware/features.py", "hardware/profile.py")


# -- keys ----------------------------------------------------------------------------------

def op_key(op: OpSpec) -> str:
    """``gemm 256x6144x4096 bf16 nk bf16``: everything of the op a ranking reads (`` w=int4-g128``
    appended for a quantized weight)."""
    w = f" w={op.weight}" if op.weight else ""
    if op.moe_gemm not in (None, "both"):  # a fused_moe op of one GEMM
        w += f" {op.moe_gemm}"
    return f"{op.kind} {'x'.join(map(str, op.shape))} {op.dtype} {op.layout} {op.out_dtype}{w}"


#: the repr of each profile object's gpu_key: every lookup names its file by it, and repr() of the
#: ~20-field key costs ~17 us, a third of a warm lookup on the 2-core CI box
_REPRS: dict[int, tuple[GPUProfile, str]] = {}


def _gpu_repr(gpu: GPUProfile) -> str:
    hit = _REPRS.get(id(gpu))
    if hit is not None and hit[0] is gpu:
        return hit[1]
    from autoopt.kernels.gpu_key import gpu_key

    text = repr(gpu_key(gpu))
    if len(_REPRS) > 256:
        _REPRS.clear()
    _REPRS[id(gpu)] = (gpu, text)
    return text


def file_for(gpu: GPUProfile, folder: Path = SHIPPED_DIR) -> Path:
    """The cache file of ``gpu``: its name slugged plus the CRC-32 of its full key (several profiles of
    one GPU model share one file; a GPU with other rates gets its own)."""
    import zlib

    slug = _SLUG.sub("-", gpu.name.lower()).strip("-") or "gpu"
    return folder / f"{slug}-{zlib.crc32(_gpu_repr(gpu).encode()):08x}{SUFFIX}"


_sources_lock = threading.Lock()
_sources: dict[str, str] | None = None


def _python_files(folder: Path) -> list[Path]:
    """The ``*.py`` files of ``folder``, sorted (``Path.glob`` costs ~1 ms more per cold start: it
    compiles a pattern and walks with scandir wrappers)."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    return [folder / n for n in sorted(names) if n.endswith(".py") and not n.startswith(".")]


def code_sources() -> dict[str, str]:
    """``{"templates/gemm.py": "<crc32 hex>", "kernels/cost.py": ..., ...}``: the code a ranking runs,
    read once per process (~16 files, ~0.5 ms). A file that cannot be read counts as ``"unreadable"``
    (a cache is then never current: nothing can show it was built from the same code)."""
    global _sources
    with _sources_lock:
        if _sources is None:
            import zlib

            from autoopt._paths import builtin_templates

            pkg = Path(__file__).resolve().parents[1]
            tpl_file = builtin_templates().__file__
            files: list[tuple[str, Path]] = []
            if tpl_file:
                files += [(f"templates/{p.name}", p) for p in _python_files(Path(tpl_file).resolve().parent)]
            for pattern in _PACKAGE_SOURCES:
                folder, _, name = pattern.rpartition("/")
                found = _python_files(pkg / folder) if name == "*.py" else [pkg / pattern]
                files += [(p.relative_to(pkg).as_posix(), p) for p in found if p.is_file()]
            out: dict[str, str] = {}
            for name, path in files:
                try:
                    out[name] = f"{zlib.crc32(path.read_bytes()):08x}"
                except OSError:
                    out[name] = "unreadable"
            _sources = out
        return _sources


def _version() -> str:
    import sys

    return str(getattr(sys.modules.get("autoopt"), "__version__", ""))


def _effective_constants(gpu: GPUProfile) -> CostConstants:
    """The constants rank() would use for ``gpu`` now: explicit ones, else the device's calibrated ones
    (:mod:`autoopt.results.constants`), else the defaults."""
    from autoopt.kernels.constants import constants, explicit
    from autoopt.results.presence import may_have_constants

    if not explicit() and may_have_constants():
        from autoopt.results.constants import calibrated_constants

        device = calibrated_constants(gpu)
        if device is not None:
            return device
    return constants()


def _builtin_templates() -> tuple[str, ...] | None:
    """The names of the templates rank() would use, or None when a plugin contributes one. Only the
    built-in plugin implementing ``autoopt_templates`` means the built-in names, read without importing
    the template modules (see ``autoopt.templates.plugin.TEMPLATE_NAMES``)."""
    from autoopt.plugins.manager import BUILTIN, get_plugin_manager

    pm = get_plugin_manager()
    if any(impl.plugin_name != BUILTIN for impl in pm.pm.hook.autoopt_templates.get_hookimpls()):
        return None
    from autoopt.templates.plugin import TEMPLATE_NAMES

    return TEMPLATE_NAMES


# -- entries -------------------------------------------------------------------------------

def _entry(answer: Candidate | AutooptError) -> dict[str, Any]:
    if isinstance(answer, AutooptError):
        kind = type(answer).__name__ if type(answer).__name__ in _ERRORS else "AutooptError"
        return {"error": kind, "message": str(answer), "reasons": list(getattr(answer, "reasons", ()))}
    return {"kernel": answer.config.kernel, "path": answer.config.path, "template": answer.config.template,
            "params": dict(answer.config.params), "predicted_us": answer.predicted_us, "bound": answer.bound,
            "roofline_pct": answer.roofline_pct, "reason": answer.reason, "breakdown": dict(answer.breakdown)}


def _answer(data: Any) -> Candidate | AutooptError:
    """An entry back as rank() gave it (numbers keep their JSON type: a template's int roofline share
    stays an int, as rank() keeps it); ValueError for anything that is not an entry (it is dropped)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"entry is {type(data).__name__}, not an object")
    if "error" in data:
        kind = _ERRORS.get(str(data["error"]))
        if kind is None or not isinstance(data.get("message"), str):
            raise ValueError(f"unknown error entry {str(data)[:80]}")
        if kind is ConfigError:
            return ConfigError(data["message"], reasons=tuple(str(r) for r in data.get("reasons", ())))
        return kind(data["message"])
    try:
        config = KernelConfig(kernel=str(data["kernel"]), params=dict(data["params"]), path=str(data["path"]),
                              template=str(data["template"]))
        breakdown = dict(data["breakdown"])
        numbers = (data["predicted_us"], data["roofline_pct"], *breakdown.values())
        if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in numbers):
            raise ValueError("a prediction that is not a number")
        return Candidate(config=config, predicted_us=float(data["predicted_us"]), bound=str(data["bound"]),
                         roofline_pct=data["roofline_pct"], reason=str(data["reason"]),
                         breakdown={str(k): v for k, v in breakdown.items()})
    except (KeyError, TypeError, AutooptError) as exc:
        raise ValueError(f"malformed entry ({type(exc).__name__}: {exc})") from None


# -- files ---------------------------------------------------------------------------------

class _File:
    """One cache file as read (mutable: entries are decoded on first use). A plain class, private to
    this module: a dataclass costs ~0.7 ms to create at import, 0.7 % of the cold-start budget."""

    __slots__ = ("body", "code_mismatch", "constants", "decoded", "header", "logged", "path")

    def __init__(self, *, path: Path, header: dict[str, Any], body: str, constants: CostConstants | None) -> None:
        self.path = path
        self.header = header
        #: the entry lines, each ``\n<op key>\t<entry JSON>``: an op's line is found when it is asked for (a
        #: dict of all ~500 lines would cost ~1.7 ms of a cold start for the ~20 a recommend() reads)
        self.body = body
        #: the header's constants as an object (compared with the effective ones on every use)
        self.constants = constants
        #: op key -> the answer, once decoded (None: the entry was malformed, and dropped)
        self.decoded: dict[str, Candidate | AutooptError | None] = {}
        #: None until the header's sources were compared with this process's code, then why not (or "")
        self.code_mismatch: str | None = None
        #: the reasons already logged for this file (each once per process)
        self.logged: set[str] = set()


_lock = threading.Lock()
#: (folder, gpu key repr) -> the file read for it (None: no file, or an unusable one)
_files: dict[tuple[Path, str], _File | None] = {}
#: folder -> the names in it (listed once: one listdir, not a stat per GPU)
_listing: dict[Path, frozenset[str]] = {}


def clear_cache() -> None:
    """Forget the files read and the source CRCs (after regenerating, or editing a template, in-process)."""
    global _sources
    with _lock:
        _files.clear()
        _listing.clear()
    with _sources_lock:
        _sources = None


def _read(path: Path) -> _File:
    """Check and read one cache file: a regular file of at most :data:`MAX_FILE_BYTES`, zlib data that
    inflates to at most :data:`MAX_TEXT_BYTES` of UTF-8, a header of this format and version. ValueError
    naming what is wrong otherwise."""
    import json
    import zlib

    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a rank cache file holds ({MAX_FILE_BYTES})")
        with path.open("rb") as fh:
            raw = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read: {exc.strerror or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError("grew while being read")
    try:
        inflate = zlib.decompressobj()
        data = inflate.decompress(raw, MAX_TEXT_BYTES)
        if inflate.unconsumed_tail:
            raise ValueError(f"inflates past {MAX_TEXT_BYTES} bytes")
        if not inflate.eof:
            raise ValueError("the compressed stream is cut short")
        text = data.decode("utf-8")
    except (zlib.error, UnicodeDecodeError) as exc:
        raise ValueError(f"not zlib-compressed UTF-8 text ({type(exc).__name__})") from None
    head, newline, body = text.partition("\n")
    try:
        header = json.loads(head)
    except (ValueError, RecursionError):
        raise ValueError("the first line is not a JSON header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    if header.get("version") != VERSION:
        raise ValueError(f"format version {header.get('version')!r}, this autoopt reads {VERSION}")
    for name, kind in (("gpu", str), ("sources", dict), ("constants", dict), ("templates", list),
                       ("autoopt_version", str)):
        if not isinstance(header.get(name), kind):
            raise ValueError(f"header field {name!r} missing or not a {kind.__name__}")
    count = body.count("\n")
    if header.get("entries") != count or (body and not body.endswith("\n")):
        raise ValueError(f"{count} entries, the header says {header.get('entries')!r} (cut short?)")
    from autoopt.kernels.constants import CostConstants

    try:
        consts = CostConstants.from_dict(header["constants"])
    except AutooptError as exc:  # a constant this version does not have (or lacks): built by other code
        raise ValueError(str(exc)) from None
    return _File(path=path, header=header, body=newline + body, constants=consts)


def _file(gpu: GPUProfile, folder: Path) -> _File | None:
    """The cache file of ``gpu`` in ``folder``, read and checked once per process (None: none, or unusable)."""
    key = _gpu_repr(gpu)
    with _lock:
        if (folder, key) in _files:
            return _files[(folder, key)]
        names = _listing.get(folder)
    if names is None:
        try:
            names = frozenset(os.listdir(folder))
        except OSError:
            names = frozenset()
        with _lock:
            _listing[folder] = names
    path = file_for(gpu, folder)
    found: _File | None = None
    if path.name in names:
        try:
            found = _read(path)
        except ValueError as exc:
            log.warning("rank cache %s ignored (ranking instead): %s", path, exc)
        else:
            if found.header["gpu"] != key:  # a CRC-32 collision or a renamed file
                log.warning("rank cache %s ignored: it holds another GPU's rankings", path)
                found = None
    with _lock:
        _files[(folder, key)] = found
    return found


def _code_mismatch(h: Mapping[str, Any]) -> str:
    """Why the code that built a file is not this process's ("" when it is the same)."""
    if h["autoopt_version"] != _version():
        return f"built by autoopt {h['autoopt_version']}, this is {_version()}"
    now = code_sources()
    if h["sources"] != now:
        changed = sorted(n for n in {*now, *h["sources"]} if now.get(n) != h["sources"].get(n))
        return f"built from other sources ({', '.join(changed[:4])}{' ...' if len(changed) > 4 else ''} changed)"
    return ""


def _stale(f: _File, gpu: GPUProfile) -> str | None:
    """Why ``f`` cannot answer for ``gpu`` now, or None when it can."""
    h = f.header
    if f.code_mismatch is None:
        f.code_mismatch = _code_mismatch(h)
    if f.code_mismatch:
        return f.code_mismatch
    templates = _builtin_templates()
    if templates is None:
        return "a plugin contributes templates"
    if list(templates) != h["templates"]:
        return f"built for templates {h['templates']}, these are {list(templates)}"
    if _effective_constants(gpu) != f.constants:
        return "built with other cost-model constants (calibrated, explicit, or changed defaults)"
    return None


def best(gpu: GPUProfile, op: OpSpec, *, folder: Path | None = None) -> Candidate | AutooptError | None:
    """``rank(gpu, op).candidates[0]`` (with a measured winner first, as rank puts it), or the error
    ``rank(gpu, op)`` raises, from the cache in ``folder``; None when the cache cannot say (no file
    for this GPU, no entry for this op, a stale or broken file, a measured winner whose prediction it
    does not hold). With no ``folder``: the shipped cache, then this machine's learned answers
    (:func:`learn`, in the cache folder's ``ranks/``)."""
    key = op_key(op)
    user = _user_folder() if folder is None else None
    answer = _entry_for(gpu, key, folder if folder is not None else SHIPPED_DIR, shipped=True)
    if answer is None and user is not None:
        answer = _entry_for(gpu, key, user, shipped=False)
    if isinstance(answer, AutooptError):
        return answer
    return _with_measured(gpu, op, answer, user)


def _entry_for(gpu: GPUProfile, key: str, folder: Path, *, shipped: bool) -> Candidate | AutooptError | None:
    """The answer of entry ``key`` in ``gpu``'s file in ``folder``, or None (no usable file or entry)."""
    f = _file(gpu, folder)
    if f is None:
        return None
    why = _stale(f, gpu)
    if why is not None:
        if why not in f.logged:
            f.logged.add(why)
            if shipped:
                log.info("rank cache %s not used: %s; regenerate it with "
                         "`python benchmarks/regen_startup_cache.py`", f.path, why)
            else:
                log.info("learned rank cache %s not used (it is rewritten as ops are ranked): %s", f.path, why)
        return None
    if key in f.decoded:
        return f.decoded[key]
    text = _line(f.body, key)
    if text is None:
        return None
    import json

    try:
        answer: Candidate | AutooptError | None = _answer(json.loads(text))
    except (ValueError, RecursionError) as exc:
        log.warning("rank cache %s: entry %r ignored: %s", f.path, key, exc)
        answer = None
    f.decoded[key] = answer
    return answer


def _line(body: str, key: str) -> str | None:
    """The entry JSON of ``key`` in a file's body, or None. Keys are whole lines' prefixes up to a tab,
    and entry JSON holds neither raw newlines nor tabs, so ``\n<key>\t`` finds exactly that line."""
    start = body.find(f"\n{key}\t")
    if start < 0:
        return None
    start += len(key) + 2
    end = body.find("\n", start)
    return body[start:end] if end >= 0 else body[start:]


def _with_measured(gpu: GPUProfile, op: OpSpec, cand: Candidate | None, user: Path | None) -> Candidate | None:
    """The cached answer ``cand`` (None: none cached) as rank() would give it with the results store's
    winner for ``op`` first: ``cand`` itself, labelled measured when the winner is its config; the
    winner's learned prediction, labelled measured, when it is another config; None when that
    prediction is not learned yet (rank() then places the winner with its own prediction). The winner
    comes from the store's start-up snapshot where one is current, else from the full lookup (which
    imports SQLite and the record types, ~10 ms cold, and writes the snapshot for the next process)."""
    from autoopt.results.presence import may_have_measured

    if not may_have_measured(gpu.device_fingerprint):
        return cand
    from autoopt.results import winners

    quick = winners.answer(gpu, op)
    if quick is None:
        return cand
    config: KernelConfig
    if isinstance(quick, winners.Winner):
        config = KernelConfig(kernel=quick.kernel, params=quick.params, path=quick.path)
        us: float | None = quick.us
        label = quick.label
    else:
        from autoopt.results.lookup import lookup

        hit = lookup(gpu, op)
        if hit is None:
            return cand
        config, us, label = hit.result.config, hit.result.us, hit.label
    if cand is None or config.key() != cand.config.key():
        learned = _entry_for(gpu, _winner_key(op, config), user, shipped=False) if user is not None else None
        if not isinstance(learned, Candidate) or learned.config.key() != config.key():
            return None
        cand = learned
    return replace(cand, measured_us=us, source=label)


# -- writing -------------------------------------------------------------------------------

def write(answers: Iterable[tuple[GPUProfile, OpSpec, Candidate | AutooptError]], folder: Path = SHIPPED_DIR,
          *, constants: Mapping[str, Any]) -> list[Path]:
    """Write one cache file per GPU of ``answers`` (rank()'s predicted best or error per op, ranked with
    ``constants`` and the built-in templates) into ``folder``; returns the files written. Files of
    this format already there are replaced or, for GPUs no longer listed, removed."""
    import json

    by_gpu: dict[str, tuple[GPUProfile, dict[str, dict[str, Any]]]] = {}
    for gpu, op, answer in answers:
        by_gpu.setdefault(_gpu_repr(gpu), (gpu, {}))[1][op_key(op)] = _entry(answer)
    templates = _builtin_templates()
    if templates is None:
        raise AutooptError("a plugin contributes templates: the shipped rank cache is built from the built-in "
                           "ones only (set AUTOOPT_DISABLE_PLUGIN_AUTOLOAD=1)")
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for _, (gpu, entries) in sorted(by_gpu.items()):
        texts = {k: json.dumps(v, sort_keys=True) for k, v in entries.items()}
        written.append(_write_file(file_for(gpu, folder), gpu, texts, constants=constants, templates=templates))
    keep = {p.name for p in written}
    for old in folder.glob(f"*{SUFFIX}"):
        if old.name not in keep:
            old.unlink()
    clear_cache()
    return written


def _write_file(path: Path, gpu: GPUProfile, entries: Mapping[str, str], *, constants: Mapping[str, Any],
                templates: Iterable[str]) -> Path:
    """Write one GPU's file (``entries``: op key -> entry JSON text) atomically; OSError as raised."""
    import json
    import zlib

    header = {"format": FORMAT, "version": VERSION, "gpu": _gpu_repr(gpu), "gpu_name": gpu.name,
              "autoopt_version": _version(), "sources": code_sources(), "constants": dict(constants),
              "templates": list(templates), "entries": len(entries)}
    lines = [json.dumps(header, sort_keys=True), *(f"{k}\t{v}" for k, v in sorted(entries.items()))]
    write_atomic(path, zlib.compress(("\n".join(lines) + "\n").encode("utf-8"), 9))
    return path


# -- learning (this machine's answers) -------------------------------------------------------

#: the learned file of a GPU keeps at most this many entries (a file of ~1 MB compressed); past it,
#: a flush starts the file again from the entries just learned
MAX_LEARNED = 20000
#: file -> (its GPU, entry key -> entry JSON text) learned in this process and not yet written
_pending: dict[Path, tuple[GPUProfile, dict[str, str]]] = {}


def _user_folder() -> Path | None:
    """Where this machine's learned answers live: ``ranks/`` in the cache folder; None when the cache is
    off or unusable (:func:`autoopt.results.location.default_path`)."""
    from autoopt.errors import StoreError
    from autoopt.results.location import RANKS_FOLDER
    from autoopt.results.presence import store_path

    try:
        store = store_path()
    except StoreError:
        return None
    return None if store is None else store.parent / RANKS_FOLDER


def _winner_key(op: OpSpec, config: KernelConfig) -> str:
    """The entry key of one config's prediction for ``op``: the op key, ``@`` and the config as JSON
    (which escapes tabs and newlines, so the key stays on its line)."""
    import json

    return f"{op_key(op)} @ {json.dumps([config.kernel, config.path, sorted(config.params.items())])}"


def learn(gpu: GPUProfile, op: OpSpec, answer: Candidate | AutooptError) -> None:
    """Keep rank()'s answer for ``op`` on ``gpu`` to write into this machine's learned cache on the next
    :func:`flush`, so that the next process answers it without ranking: the top candidate (or error)
    of an op the shipped cache lacks, or, for a measured winner, that config's prediction (the measured
    time is looked up afresh on each use)."""
    folder = _user_folder()
    if folder is None:
        return
    import json

    measured = isinstance(answer, Candidate) and answer.measured_us is not None
    key = _winner_key(op, answer.config) if isinstance(answer, Candidate) and measured else op_key(op)
    text = json.dumps(_entry(answer), sort_keys=True)
    with _lock:
        _pending.setdefault(file_for(gpu, folder), (gpu, {}))[1][key] = text


def flush() -> list[Path]:
    """Write the learned answers into their files (merged with a current file's entries; a stale file is
    replaced); returns the files written. A file that cannot be written is logged and skipped: the
    cache only saves time."""
    with _lock:
        pending = dict(_pending)
        _pending.clear()
    templates = _builtin_templates()
    if not pending or templates is None:  # a plugin's template could win an op: nothing is kept
        return []
    written: list[Path] = []
    for path, (gpu, entries) in pending.items():
        old = _file(gpu, path.parent)
        merged: dict[str, str] = {}
        if old is not None and _stale(old, gpu) is None:
            merged = dict(line.split("\t", 1) for line in old.body.split("\n") if "\t" in line)
        merged.update(entries)
        if len(merged) > MAX_LEARNED:
            merged = dict(entries)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            written.append(_write_file(path, gpu, merged, constants=_effective_constants(gpu).to_dict(),
                                       templates=templates))
        except OSError as exc:  # a read-only cache folder (a container image, say) is a normal set-up
            log.info("learned rank cache %s not written: %s", path, exc)
        with _lock:
            _files.pop((path.parent, _gpu_repr(gpu)), None)
            _listing.pop(path.parent, None)
    return written
