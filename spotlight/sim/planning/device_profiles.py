"""GPU profiles for `spotlight plan`: peak and sustained throughput, memory, links, and where each number is from.

The shipped profiles live in ``spotlight/market/gpus.yaml`` (package data). A user's measurement goes
into a profile file of the same shape (``gpus:``, a list of entries with a ``name`` and any fields to
override), which `load_profiles` merges over the shipped ones: `write_measured_efficiency` writes one,
from what ``benchmarks/gpu/gpu_throughput.py`` measured, so that the next `plan` predicts with the user's
own efficiency and says so. The efficiencies are fractions of the dense bf16 peak that this workload
(a DiT's forward, or forward and backward) reaches end to end, not a matmul benchmark's.
"""

from __future__ import annotations

import importlib.resources
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["DeviceProfile", "ProfileError", "default_profile_path", "load_profiles", "profile",
           "write_measured_efficiency"]


class ProfileError(ValueError):
    """A GPU profile that is missing or malformed; one line naming the file, the entry and the fix."""


class DeviceProfile(BaseModel):
    """One GPU: what it computes (peak, sustained, efficiency), holds and moves, with sources."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    price_gpu: str = Field(min_length=1)
    peak_bf16_dense_tflops: float = Field(gt=0)
    peak_source: str
    memory_gb: float = Field(gt=0)
    hbm_tb_per_s: float = Field(gt=0)
    memory_source: str
    nvlink_achieved_gb_per_s: float = Field(gt=0)
    network_achieved_gb_per_s: float = Field(gt=0)
    link_source: str
    sustained_matmul_tflops: float | None = Field(None, gt=0)
    rollout_efficiency: float = Field(gt=0, le=1)
    update_efficiency: float = Field(gt=0, le=1)
    efficiency_source: str

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)


def default_profile_path() -> Path:
    """The user's profile file: $SPOTLIGHT_GPU_PROFILES, else $XDG_CONFIG_HOME (~/.config)/spotlight/gpus.yaml."""
    if os.environ.get("SPOTLIGHT_GPU_PROFILES"):
        return Path(os.environ["SPOTLIGHT_GPU_PROFILES"])
    config_home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config_home / "spotlight" / "gpus.yaml"


def _entries(text: str, name: str) -> list[dict[str, Any]]:
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ProfileError(f"{name}: not valid YAML ({getattr(error, 'problem', error)})") from None
    entries = document.get("gpus") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "name" in e for e in entries):
        raise ProfileError(f"{name}: expected a top-level 'gpus:' list of entries, each with a name")
    return entries


def load_profiles(user_path: str | Path | None = None) -> dict[str, DeviceProfile]:
    """The shipped profiles by name, with a user file's entries merged over them (new names added).

    ``user_path`` None: `default_profile_path()` when that file exists. Raises ProfileError naming the
    file, the entry and the field for anything malformed.
    """
    shipped = importlib.resources.files("spotlight.market").joinpath("gpus.yaml").read_text(encoding="utf-8")
    merged = {entry["name"]: entry for entry in _entries(shipped, "spotlight/market/gpus.yaml")}
    path = Path(user_path) if user_path is not None else default_profile_path()
    if user_path is not None and not path.is_file():
        raise ProfileError(f"plan.profiles {path}: no such GPU profile file; write one with "
                           "benchmarks/gpu/gpu_throughput.py or leave plan.profiles out")
    if path.is_file():
        for entry in _entries(path.read_text(encoding="utf-8"), str(path)):
            merged[entry["name"]] = {**merged.get(entry["name"], {}), **entry}
    profiles = {}
    for name, entry in merged.items():
        try:
            profiles[name] = DeviceProfile.model_validate(entry)
        except ValidationError as error:
            first = error.errors()[0]
            field = ".".join(str(part) for part in first["loc"])
            where = f"{path} or the shipped gpus.yaml"
            raise ProfileError(f"GPU profile {name}: {field}: {first['msg']} (in {where})") from None
    return profiles


def profile(name: str, user_path: str | Path | None = None) -> DeviceProfile:
    """The profile ``name``; ProfileError naming the known ones (and how to add one) otherwise."""
    profiles = load_profiles(user_path)
    if name not in profiles:
        raise ProfileError(f"plan.gpu {name!r} has no GPU profile: use one of {', '.join(sorted(profiles))}, or add "
                           f"an entry with every DeviceProfile field to {user_path or default_profile_path()}")
    return profiles[name]


def write_measured_efficiency(path: str | Path, gpu: str, *, rollout_efficiency: float, update_efficiency: float,
                              source: str, sustained_matmul_tflops: float | None = None,
                              base: DeviceProfile | None = None) -> Path:
    """Write (or update) ``gpu``'s entry in the profile file ``path`` with measured efficiencies.

    ``source`` says what was measured (benchmark, folder, commit, date); it replaces the entry's
    efficiency_source, so `plan` prints it beside the numbers. ``base``: a full profile to start a new
    name from (a GPU the shipped file lacks). Other entries of the file are kept.
    """
    path = Path(path)
    entries = _entries(path.read_text(encoding="utf-8"), str(path)) if path.is_file() else []
    by_name = {entry["name"]: entry for entry in entries}
    entry = by_name.get(gpu, base.model_dump() if base is not None else {"name": gpu})
    entry.update(rollout_efficiency=float(rollout_efficiency), update_efficiency=float(update_efficiency),
                 efficiency_source=source)
    if sustained_matmul_tflops is not None:
        entry["sustained_matmul_tflops"] = float(sustained_matmul_tflops)
    by_name[gpu] = entry
    for value in (rollout_efficiency, update_efficiency):
        if not 0 < value <= 1:
            raise ProfileError(f"{gpu}: an efficiency is a fraction of the dense peak in (0, 1] (got {value})")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"gpus": list(by_name.values())}, sort_keys=False), encoding="utf-8")
    return path
