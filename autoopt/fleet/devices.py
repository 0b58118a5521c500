"""The devices a fleet run uses: ``--gpus all|0,1,3`` checked against the GPUs this host has.

A :class:`Device` is one worker's GPU: its name for the pool (the NVML index, ``"0"``), the profile
detected for it, and its *kind*, the device fingerprint: the results store's key, so two GPUs of one
model share a kind (an op's configs may go to either) and heterogeneous GPUs of one host are distinct
devices. With ``AUTOOPT_FLEET_FAKE_GPUS=h100-sxm,h100-sxm`` (tests, CI) the host has instead one fake
GPU per listed known profile, each a CPU worker (``cpu0``, ``cpu1``, ...) that predicts for its profile,
or checks configs in Triton's interpreter when ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from autoopt._log import get_logger
from autoopt.errors import AutooptError, BackendError
from autoopt.hardware.profile import GPUProfile

__all__ = ["FAKE_ENV", "Device", "local_devices", "parse_gpus"]

log = get_logger(__name__)

FAKE_ENV = "AUTOOPT_FLEET_FAKE_GPUS"
ACCEPTED = "give all, or GPU indices separated by commas such as 0,1,3"


@dataclass(frozen=True, slots=True, kw_only=True)
class Device:
    """One worker's device: ``name`` for the pool, the GPU it is, and for a CPU stand-in the known
    profile it predicts for."""

    name: str
    gpu: GPUProfile
    profile: str | None = None

    @property
    def kind(self) -> str:
        """The device fingerprint: evaluations of one kind may run on any device of it."""
        return self.gpu.device_fingerprint

    def to_dict(self) -> dict[str, object]:
        return {"device": self.name, "gpu": self.gpu.name, "fingerprint": self.kind, "profile": self.profile}


def parse_gpus(spec: str) -> list[int] | None:
    """``all`` -> None (every GPU); ``0,1,3`` -> [0, 1, 3]; anything else is an AutooptError naming it."""
    text = spec.strip()
    if not text:
        raise AutooptError(f"--gpus is empty: {ACCEPTED}")
    if text.lower() == "all":
        return None
    out: list[int] = []
    for part in text.split(","):
        token = part.strip()
        if not token.isdigit():
            raise AutooptError(f"--gpus {spec!r}: {token!r} is not a GPU index; {ACCEPTED}")
        if int(token) in out:
            raise AutooptError(f"--gpus {spec!r}: GPU {token} is named twice; {ACCEPTED}")
        out.append(int(token))
    return out


def _fake_devices() -> dict[int, Device]:
    from autoopt.hardware.library import load_profile

    names = [n.strip() for n in os.environ.get(FAKE_ENV, "").split(",") if n.strip()]
    return {k: Device(name=f"cpu{k}", gpu=_gpu_of(load_profile(n).gpu, n), profile=n) for k, n in enumerate(names)}


def _gpu_of(gpu: GPUProfile | None, name: str) -> GPUProfile:
    if gpu is None:
        raise AutooptError(f"{FAKE_ENV}: profile {name!r} has no GPU")
    return gpu


def _detected_devices() -> dict[int, Device]:
    from autoopt.hardware.detection import detect

    return {g.index: Device(name=str(g.index), gpu=g) for g in detect().gpus}


def local_devices(spec: str) -> list[Device]:
    """This host's devices that ``spec`` names (``all``, ``0,1,3``), in the order given."""
    wanted = parse_gpus(spec)
    present = _fake_devices() if os.environ.get(FAKE_ENV) else _detected_devices()
    if not present:
        raise BackendError("--gpus: this host has no GPU that autoopt can see (detection found none); run "
                           "without --gpus (and pass --profile NAME to predict for a known GPU)")
    for index in wanted or ():
        if index not in present:
            raise AutooptError(f"--gpus {spec!r}: this host has no GPU {index} (it has "
                               f"{','.join(map(str, sorted(present)))}); {ACCEPTED}")
    chosen = [present[i] for i in (sorted(present) if wanted is None else wanted)]
    log.info("fleet: devices %s", ", ".join(f"{d.name}={d.gpu.name}" for d in chosen))
    return chosen
