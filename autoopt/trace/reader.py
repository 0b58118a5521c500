"""Read a profiler trace as a stream of GPU kernel events, in bounded memory.

Input: the Chrome-trace JSON ``torch.profiler.profile(...).export_chrome_trace`` writes (gzipped or
not), and Perfetto-compatible JSON of the same format from other tools: an object with a
``traceEvents`` array, or a bare array of events. The array is decoded one event at a time from
64 KiB chunks (``json.JSONDecoder.raw_decode`` over a sliding buffer), so a 500 MB trace needs the
memory of one event plus the chunk, not of the whole file.

GPU work is the complete events (``ph: "X"``) of the categories the profiler gives device activity:
``kernel``, ``gpu_memcpy``, ``gpu_memset`` (Kineto; AMD's roctracer uses the same names). Step
markers are the ``ProfilerStep#N`` ranges (``cpu_op``/``user_annotation``); ``record_function``
ranges on the GPU timeline (``gpu_user_annotation``) are kept for per-layer alignment.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import stat
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from autoopt.errors import TraceError

__all__ = ["GPU_CATEGORIES", "MAX_TRACE_BYTES", "Annotation", "TraceEvents", "read"]

#: the largest trace file read (compressed size for .gz): 4 GiB
MAX_TRACE_BYTES = 4 << 30
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
_CHUNK = 1 << 16
#: a single event larger than this is not a profiler event (a corrupt or hostile file)
_MAX_EVENT_BYTES = 16 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class Annotation:
    """A named range: a profiler step (``ProfilerStep#N``) or a ``record_function`` on the GPU timeline."""

    name: str
    ts: float
    dur: float
    gpu: bool


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class TraceEvents:
    """A trace's GPU activity, compact: each distinct kernel name once, and the time-ordered sequence
    as parallel arrays of name index, start and duration (microseconds): 20 bytes per kernel."""

    source: str
    names: tuple[str, ...]
    categories: tuple[str, ...]
    seq: array
    ts: array
    dur: array
    annotations: tuple[Annotation, ...]
    cpu_events: int

    @property
    def total_us(self) -> float:
        return float(sum(self.dur))

    def __len__(self) -> int:
        return len(self.seq)


def _open(path: Path) -> IO[bytes]:
    """The file's bytes, gunzipped when it starts with the gzip magic; checked first."""
    source = str(path)
    try:
        st = path.stat()
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if not stat.S_ISREG(st.st_mode):
        raise TraceError("is not a regular file (a folder, device, pipe or socket)", source=source)
    if st.st_size > MAX_TRACE_BYTES:
        raise TraceError(f"is {st.st_size} bytes; a trace is at most {MAX_TRACE_BYTES} bytes", source=source)
    if st.st_size == 0:
        raise TraceError("is empty: not a trace", source=source)
    raw = path.open("rb")
    head = raw.read(2)
    raw.seek(0)
    return cast(IO[bytes], gzip.GzipFile(fileobj=raw)) if head == b"\x1f\x8b" else raw


def _chunks(fh: IO[bytes], source: str) -> Iterator[str]:
    decoder = io.TextIOWrapper(fh, encoding="utf-8")
    try:
        while True:
            chunk = decoder.read(_CHUNK)
            if not chunk:
                return
            yield chunk
    except UnicodeDecodeError:
        raise TraceError("is not UTF-8 text: a binary file, not a Chrome/Perfetto trace", source=source) from None
    except (OSError, EOFError) as exc:
        raise TraceError(f"cannot be decompressed ({exc}): a truncated or corrupt .gz", source=source) from None


def _events(path: Path) -> Iterator[dict[str, Any]]:
    """Each event object of the trace's event array, streamed."""
    source = str(path)
    dec = json.JSONDecoder()
    with _open(path) as fh:
        chunks = _chunks(fh, source)
        buf, pos = "", 0

        def more() -> bool:
            nonlocal buf, pos
            nxt = next(chunks, None)
            if nxt is None:
                return False
            buf, pos = buf[pos:] + nxt, 0
            return True

        def skip_ws() -> str:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,":
                    pos += 1
                if pos < len(buf):
                    return buf[pos]
                if not more():
                    return ""

        first = skip_ws()
        if first == "{":
            # find the "traceEvents" array; other top-level keys come before or after it
            while True:
                at = buf.find('"traceEvents"', pos)
                if at >= 0:
                    bracket = buf.find("[", at)
                    if bracket >= 0:
                        pos = bracket + 1
                        break
                if not more():
                    raise TraceError("has no \"traceEvents\" array: not a Chrome/Perfetto trace", source=source)
        elif first == "[":
            pos += 1
        else:
            raise TraceError("does not start with a JSON object or array: not a Chrome/Perfetto trace",
                             source=source)
        while True:
            c = skip_ws()
            if c == "]":
                return
            if c == "":
                raise TraceError("ends inside the event array: a truncated trace", source=source)
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if len(buf) - pos > _MAX_EVENT_BYTES:
                    raise TraceError(f"has an event over {_MAX_EVENT_BYTES} bytes or invalid JSON near "
                                     f"character {pos}", source=source) from None
                if not more():
                    raise TraceError("ends inside an event: a truncated trace", source=source) from None
                continue
            pos = end
            if isinstance(obj, dict):
                yield obj


def read(path: str | os.PathLike[str]) -> TraceEvents:
    """The GPU kernels and annotations of a trace file; TraceError for anything that is not a usable one."""
    p = Path(path)
    index: dict[str, int] = {}
    names: list[str] = []
    cats: list[str] = []
    seq, tss, durs = array("i"), array("d"), array("d")
    notes: list[Annotation] = []
    cpu = 0
    for e in _events(p):
        if e.get("ph") != "X":
            continue
        cat, name = str(e.get("cat", "")), str(e.get("name", ""))
        try:
            ts, dur = float(e.get("ts", 0.0)), float(e.get("dur", 0.0))
        except (TypeError, ValueError):
            continue
        if cat in GPU_CATEGORIES:
            i = index.get(name)
            if i is None:
                i = index[name] = len(names)
                names.append(name)
                cats.append(cat)
            seq.append(i)
            tss.append(ts)
            durs.append(dur)
        elif name.startswith("ProfilerStep#") or cat == "gpu_user_annotation":
            notes.append(Annotation(name=name, ts=ts, dur=dur, gpu=cat == "gpu_user_annotation"))
        else:
            cpu += 1
    if not seq:
        what = f"{cpu} CPU events and no GPU kernels: a CPU-only trace" if cpu else "no events"
        raise TraceError(f"has {what} (profile with ProfilerActivity.CUDA on a GPU)", source=str(p))
    if any(tss[k] > tss[k + 1] for k in range(len(tss) - 1)):  # Kineto writes per stream: merge by start
        order = sorted(range(len(tss)), key=tss.__getitem__)
        seq, tss, durs = (array(a.typecode, (a[k] for k in order)) for a in (seq, tss, durs))  # type: ignore[assignment]
    return TraceEvents(source=str(p), names=tuple(names), categories=tuple(cats), seq=seq, ts=tss, dur=durs,
                       annotations=tuple(notes), cpu_events=cpu)
