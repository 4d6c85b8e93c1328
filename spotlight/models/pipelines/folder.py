"""A local diffusers pipeline folder read as plain JSON: its family, latent geometry and sigma schedule.

Everything here reads ``model_index.json`` and the ``config.json`` files of ``transformer/``, ``vae/``
and ``scheduler/`` and imports neither diffusers nor torch weights, so a config can be validated, a
sampling plan made and a spot device told what to build before any model is loaded. The numbers are
the ones the family's own pipeline derives (``vae_scale_factor``, the 2x2 packing, ``calculate_shift``'s
``mu``), so that Spotlight samples on the grid and schedule that ``pipe(...)`` would.

A component's class is what ``model_index.json`` names for it (``"text_encoder": ["transformers",
"CLIPTextModelWithProjection"]``), as ``DiffusionPipeline.from_pretrained`` takes it (`component_class`).
Keys that published folders carry but diffusers never reads to pick a class are not required: a
text encoder's ``architectures`` and ``model_type`` (transformers writes them only when it saves a
model; a folder assembled from configs lacks them) and a component config's ``_class_name``; where
present, ``_class_name`` is a cross-check only. A key a component's config leaves out is its class's
default, as diffusers reads it (`spotlight.models.folder_defaults`).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from spotlight.models.folder_defaults import with_class_defaults
from spotlight.models.pipelines.family_config import Family

__all__ = ["PIPELINE_FAMILIES", "ComponentClassError", "PipelineFolder", "PipelineFolderError", "ScheduleParams",
           "component_class", "read_pipeline_folder"]

# model_index.json's _class_name -> family. Only the text-to-image pipelines: an img2img or inpainting
# folder holds the same parts but is saved under its own class; the base class name is what users download.
PIPELINE_FAMILIES: dict[str, Family] = {
    "StableDiffusion3Pipeline": "sd3",
    "FluxPipeline": "flux",
    "FluxKontextPipeline": "flux",  # FLUX.1 Kontext: FLUX's transformer, conditioned on a source image too
    "QwenImagePipeline": "qwen-image",
    "QwenImageEditPipeline": "qwen-image",  # Qwen-Image-Edit: Qwen-Image's transformer, the source image's tokens too
    "QwenImageEditPlusPipeline": "qwen-image",  # Qwen-Image-Edit-2509: the same, another prompt template
    "WanPipeline": "wan",
}
# the families whose samples are videos: latents (C, f, h, w) of num_frames frames (`PipelineFolder.latent_shape`)
VIDEO_FAMILIES: frozenset[Family] = frozenset({"wan"})
# the pipelines whose samples edit a source image (`spotlight.models.editing`): a dataset row is an instruction
# and its image, and the image's latents join the model input
EDIT_PIPELINES: frozenset[str] = frozenset({"FluxKontextPipeline", "QwenImageEditPipeline",
                                            "QwenImageEditPlusPipeline"})
DEFAULT_NUM_FRAMES = 81  # WanPipeline.__call__'s default
# What the family's pipeline passes to calculate_shift when the scheduler config does not say
# (SD3's pipeline defaults max_shift to 1.16, FLUX's and Qwen-Image's to 1.15).
_SHIFT_DEFAULTS: dict[Family, tuple[int, int, float, float]] = {
    "sd3": (256, 4096, 0.5, 1.16), "flux": (256, 4096, 0.5, 1.15), "qwen-image": (256, 4096, 0.5, 1.15),
    "wan": (256, 4096, 0.5, 1.15)}
_UNSUPPORTED_SCHEDULES = ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "invert_sigmas",
                          "stochastic_sampling")


class PipelineFolderError(ValueError):
    """A folder that is not a usable pipeline, or a resolution it cannot take; one line: the cause and the fix."""


class ComponentClassError(PipelineFolderError):
    """``model_index.json`` names a class (or library) for a component that this install lacks; one line naming
    the class, the library and the version the folder was saved with."""


@dataclass(frozen=True)
class ScheduleParams:
    """The pipeline's sigma schedule for one latent size, in `spotlight.diffusion.schedule.sigma_schedule`'s terms.

    ``shift``: the static shift, or the dynamic one folded in (``exp(mu)`` for exponential time shifting,
    ``mu`` for linear: both equal ``s t / (1 + (s - 1) t)`` with that ``s``); ``grid_end``: the last
    unshifted sigma of the grid (None: ``1 / num_steps``, what FLUX's and Qwen-Image's pipelines pass;
    SD3's pipeline lets the scheduler end its grid at its ``sigma_min``); ``shift_terminal``: stretch
    the schedule so its last non-zero sigma is this (Qwen-Image's 0.02).
    """

    shift: float
    grid_end: float | None
    shift_terminal: float | None


@dataclass(frozen=True)
class PipelineFolder:
    """What Spotlight reads from a pipeline folder before loading any weights."""

    path: Path
    family: Family
    components: tuple[str, ...]
    transformer: dict[str, Any]
    vae: dict[str, Any]
    scheduler: dict[str, Any]
    index: dict[str, Any] = field(default_factory=dict)  # model_index.json: each component's class

    def class_name(self, part: str) -> tuple[str, str]:
        """(library, class) that ``model_index.json`` names for ``part``: what diffusers builds it from."""
        entry = self.index.get(part)
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(item, str) for item in entry)):
            raise PipelineFolderError(f"{self.path}/model_index.json gives {part} as {entry!r}, not [library, class]: "
                                      f"write it as diffusers saves it, e.g. [\"diffusers\", \"AutoencoderKL\"]")
        return entry[0], entry[1]

    @property
    def boundary_ratio(self) -> float | None:
        """Wan2.2 A14B's expert switch: ``transformer`` denoises t >= ratio x num_train_timesteps, ``transformer_2``
        below (None: one transformer, Wan2.1 and every image family)."""
        ratio = self.index.get("boundary_ratio")
        return float(ratio) if "transformer_2" in self.components and ratio is not None else None

    @property
    def experts(self) -> tuple[str, ...]:
        """The folder's transformers, high-noise first: ``("transformer", "transformer_2")`` for Wan2.2 A14B."""
        return ("transformer", "transformer_2") if self.boundary_ratio is not None else ("transformer",)

    def check_guidance_scale_2(self, guidance_scale: float, guidance_scale_2: float | None) -> None:
        """PipelineFolderError unless ``guidance_scale_2`` (the low-noise expert's scale, ``WanPipeline``'s) would
        be used: it needs a second expert, and guidance at all (``guidance_scale`` > 1; the pipeline guides
        neither expert otherwise and ignores it)."""
        if guidance_scale_2 is None:
            return
        if self.boundary_ratio is None:
            raise PipelineFolderError(f"rollout.guidance_scale_2 guides the low-noise expert of a two-expert Wan2.2 "
                                      f"folder (transformer_2 and boundary_ratio in model_index.json); {self.path} "
                                      f"has one transformer: remove rollout.guidance_scale_2 (rollout.guidance_scale "
                                      f"guides every step)")
        if guidance_scale <= 1.0 and guidance_scale_2 != guidance_scale:
            raise PipelineFolderError(f"rollout.guidance_scale_2 {guidance_scale_2} would be ignored: WanPipeline "
                                      f"guides only when guidance_scale > 1 (rollout.guidance_scale is "
                                      f"{guidance_scale}): raise rollout.guidance_scale or remove "
                                      f"rollout.guidance_scale_2")

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell, as the family's pipeline computes it from the VAE config."""
        if self.family == "qwen-image":
            return 2 ** len(self.vae.get("temperal_downsample", [False, True, True]))
        if self.family == "wan":  # WanPipeline reads it from the VAE config
            return int(self.vae.get("scale_factor_spatial") or 8)
        return 2 ** (len(self.vae.get("block_out_channels", [0, 0, 0, 0])) - 1)

    @property
    def latent_channels(self) -> int:
        """Channels C of the unpacked (B, C, h, w) latents (FLUX / Qwen-Image transformers take 4C packed)."""
        in_channels = int(self.transformer["in_channels"])
        return in_channels if self.family in ("sd3", "wan") else in_channels // 4

    @property
    def edits(self) -> bool:
        """Whether a sample edits a source image (an edit pipeline: instruction + image per dataset row)."""
        return self.index.get("_class_name") in EDIT_PIPELINES

    @property
    def is_video(self) -> bool:
        """Whether a sample is a video (latents (C, f, h, w)) rather than an image (C, h, w)."""
        return self.family in VIDEO_FAMILIES

    def num_latent_frames(self, num_frames: int | None) -> int:
        """Latent frames of ``num_frames`` video frames (None: the pipeline's 81), as ``WanPipeline`` computes them;
        PipelineFolderError naming the counts that work when ``num_frames - 1`` is not a multiple of the VAE's
        temporal scale (the pipeline would silently round it)."""
        frames = DEFAULT_NUM_FRAMES if num_frames is None else num_frames
        temporal = int(self.vae.get("scale_factor_temporal") or 4)
        if frames < 1 or (frames - 1) % temporal:
            lower = max(1, (frames - 1) // temporal * temporal + 1)
            raise PipelineFolderError(f"rollout.num_frames {frames} does not fit {self.path}: {self.family} needs "
                                      f"num_frames - 1 divisible by {temporal} (its VAE's temporal scale), e.g. "
                                      f"{lower} or {lower + temporal}")
        return (frames - 1) // temporal + 1

    def latent_shape(self, resolution: tuple[int, int], num_frames: int | None = None) -> tuple[int, ...]:
        """The latents of one sample: (C, h, w) for an image, (C, f, h, w) for a video of ``num_frames``."""
        height, width = self.latent_size(resolution)
        if self.is_video:
            return (self.latent_channels, self.num_latent_frames(num_frames), height, width)
        return (self.latent_channels, height, width)

    def image_tokens(self, resolution: tuple[int, int], num_frames: int | None = None) -> int:
        """The transformer's latent tokens per sample: patches of the latent image, or of every latent frame; an
        edit pipeline's as many again (the source image's, at the same size, follow the target's)."""
        height, width = self.latent_size(resolution)
        frames = self.num_latent_frames(num_frames) if self.is_video else 1
        return frames * (height // self._patch) * (width // self._patch) * (2 if self.edits else 1)

    @property
    def default_resolution(self) -> tuple[int, int]:
        """The pipeline's default image size: SD3's transformer sample_size, FLUX's / Qwen-Image's 128 latents,
        Wan's 480 x 832 video frames."""
        if self.family == "wan":
            return 480, 832
        latents = int(self.transformer.get("sample_size", 128)) if self.family == "sd3" else 128
        size = latents * self.vae_scale_factor
        return size, size

    def latent_size(self, resolution: tuple[int, int]) -> tuple[int, int]:
        """Latent (h, w) of ``resolution`` (pixels); PipelineFolderError naming the sizes that work otherwise."""
        height, width = resolution
        step = self.vae_scale_factor * self._patch
        if height <= 0 or width <= 0 or height % step or width % step:
            raise PipelineFolderError(
                f"rollout.resolution {height}x{width} does not fit {self.path}: {self.family} needs height and width "
                f"divisible by {step} (VAE scale {self.vae_scale_factor} x patch {self._patch}); e.g. "
                f"{max(step, height // step * step)}")
        if self.family == "sd3":
            largest = int(self.transformer.get("pos_embed_max_size", 96)) * self._patch * self.vae_scale_factor
            if max(height, width) > largest:
                raise PipelineFolderError(
                    f"rollout.resolution {height}x{width} is larger than {self.path}'s SD3 position table allows "
                    f"({largest} px per side): choose at most {largest}")
        return height // self.vae_scale_factor, width // self.vae_scale_factor

    @property
    def _patch(self) -> int:
        if self.family == "wan":  # (t, h, w) patches
            return int((self.transformer.get("patch_size") or [1, 2, 2])[1])
        return int(self.transformer.get("patch_size", 2)) if self.family == "sd3" else 2

    def schedule(self, latent_size: tuple[int, int]) -> ScheduleParams:
        """The sigma schedule the family's pipeline runs at ``latent_size``, with ``mu`` from its image tokens."""
        config = self.scheduler
        for flag in _UNSUPPORTED_SCHEDULES:
            if config.get(flag):
                raise PipelineFolderError(f"{self.path}/scheduler sets {flag}, which Spotlight's flow-matching sampler "
                                          f"does not implement: set it to false in scheduler_config.json")
        height, width = latent_size
        tokens = (height // self._patch) * (width // self._patch)
        # UniPC's flow sigmas (Wan2.1's folders) name the static shift flow_shift; their grid runs from
        # 1 - 1/num_train_timesteps where Spotlight's starts at 1 (the sampler is Euler / SDE either way)
        shift = float(config.get("flow_shift") or config.get("shift", 1.0))
        if config.get("use_dynamic_shifting"):
            base_len, max_len, base_shift, max_shift = _SHIFT_DEFAULTS[self.family]
            base_len = config.get("base_image_seq_len", base_len)
            max_len = config.get("max_image_seq_len", max_len)
            base_shift = config.get("base_shift", base_shift)
            max_shift = config.get("max_shift", max_shift)
            slope = (max_shift - base_shift) / (max_len - base_len)
            mu = tokens * slope + base_shift - slope * base_len
            shift = math.exp(mu) if config.get("time_shift_type", "exponential") == "exponential" else mu
        grid_end = None
        if self.family == "sd3" or self.family == "wan" and "flow_shift" not in config:
            # the scheduler's own grid: from 1 down to its sigma_min (WanPipeline passes no sigmas either)
            train_steps = int(config.get("num_train_timesteps", 1000))
            first = 1.0 / train_steps
            static = float(config.get("shift", 1.0))
            grid_end = first if config.get("use_dynamic_shifting") else static * first / (1 + (static - 1) * first)
        terminal = config.get("shift_terminal")
        return ScheduleParams(shift=shift, grid_end=grid_end, shift_terminal=float(terminal) if terminal else None)


def _saved_with(folder: PipelineFolder, part: str, library: str) -> str | None:
    """The ``library`` version that saved ``part`` (its config's ``transformers_version`` / ``_diffusers_version``,
    else model_index.json's), or None when no file says."""
    key = "_diffusers_version" if library == "diffusers" else f"{library}_version"
    for path in sorted((folder.path / part).glob("*config.json")):
        try:
            version = json.loads(path.read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(version, str):
            return version
    version = folder.index.get(f"_{library}_version") if library == "diffusers" else None
    return version if isinstance(version, str) else None


def component_class(folder: PipelineFolder, part: str) -> type:
    """The class ``model_index.json`` names for ``part``, imported from its library (as diffusers resolves it).

    Raises ComponentClassError (one line) when the library is not installed or has no such class: the
    message names the class, the library, the installed version and the version that saved the folder.
    """
    from importlib import metadata

    library, name = folder.class_name(part)
    try:
        module = importlib.import_module(library)
    except ImportError:
        raise ComponentClassError(f"{folder.path}/model_index.json names {library}.{name} for {part}, but {library} "
                                  f"is not installed: pip install {library}") from None
    try:
        cls = getattr(module, name, None)
    except ImportError as error:  # the class exists but needs a backend this install lacks
        raise ComponentClassError(f"{folder.path}/model_index.json names {library}.{name} for {part}, which cannot "
                                  f"be imported here ({_one_line(error)})") from None
    if isinstance(cls, type):
        return cls
    try:
        installed = metadata.version(library.split(".")[0])
    except metadata.PackageNotFoundError:
        installed = "(version unknown)"
    saved = _saved_with(folder, part, library.split(".")[0])
    if saved is not None and _newer(saved, installed):
        need = f"install {library}>={saved}, the version that saved {part}"
    else:
        need = f"install a {library} version that has {name}, or correct the class in model_index.json"
    raise ComponentClassError(f"{folder.path}/model_index.json names {library}.{name} for {part}, which the "
                              f"installed {library} {installed} lacks: {need}")


def _newer(version: str, than: str) -> bool:
    """Whether ``version`` is a later release than ``than`` (False when either cannot be parsed)."""
    try:  # packaging comes with transformers and torch
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return False
    try:
        return Version(version) > Version(than)
    except InvalidVersion:
        return False


def _one_line(error: BaseException) -> str:
    """``error``'s message on one line."""
    return " ".join(str(error).split()) or type(error).__name__


def _read_json(path: Path, folder: Path, what: str) -> dict[str, Any]:
    if not path.is_file():
        raise PipelineFolderError(f"{folder} has no {path.relative_to(folder)} ({what}): pass a complete diffusers "
                                  f"pipeline folder (as DiffusionPipeline.save_pretrained writes it)")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PipelineFolderError(f"{path} is unreadable ({type(error).__name__}): re-download the pipeline") from None
    if not isinstance(data, dict):
        raise PipelineFolderError(f"{path} is not a JSON object: re-download the pipeline")
    return data


@lru_cache(maxsize=16)
def _read(folder: Path) -> PipelineFolder:
    if not folder.is_dir():
        raise PipelineFolderError(f"model.pretrained {folder} is not a folder: pass a local diffusers pipeline folder "
                                  f"(model_index.json, transformer/, vae/, text_encoder*/, scheduler/)")
    index = _read_json(folder / "model_index.json", folder, "the pipeline's index")
    class_name = str(index.get("_class_name", ""))
    if class_name not in PIPELINE_FAMILIES:
        known = ", ".join(f"{name} ({family})" for name, family in PIPELINE_FAMILIES.items())
        raise PipelineFolderError(f"{folder} holds a {class_name or 'pipeline of no class'}, which Spotlight does not "
                                  f"post-train: pass a folder of one of {known}")
    components = tuple(sorted(name for name, value in index.items()
                              if not name.startswith("_") and isinstance(value, list) and value[0] is not None))
    for needed in ("transformer", "vae", "scheduler", "text_encoder", "tokenizer"):
        if needed not in components:
            raise PipelineFolderError(f"{folder}/model_index.json lists no {needed}: Spotlight needs the pipeline's "
                                      f"transformer, vae, text encoders and scheduler; pass the full pipeline folder")
    if index.get("expand_timesteps"):  # Wan2.2 TI2V-5B's per-token timesteps
        raise PipelineFolderError(f"{folder} is a Wan2.2 TI2V pipeline (expand_timesteps), which Spotlight does not "
                                  f"post-train yet: pass a Wan2.1 or Wan2.2 A14B text-to-video folder")
    _check_experts(folder, index, components)
    def config(part: str, file: str, what: str) -> dict[str, Any]:
        """``part``'s config as its class reads it: the keys it omits are the class's defaults (folder_defaults)."""
        entry = index.get(part)
        return with_class_defaults(entry[1] if isinstance(entry, list) and len(entry) == 2 else None,
                                   _read_json(folder / part / file, folder, what))

    return PipelineFolder(
        path=folder, family=PIPELINE_FAMILIES[class_name], components=components,
        transformer=config("transformer", "config.json", "the transformer's config"),
        vae=config("vae", "config.json", "the VAE's config"),
        scheduler=config("scheduler", "scheduler_config.json", "the scheduler's config"),
        index=index,
    )


def _check_experts(folder: Path, index: dict[str, Any], components: tuple[str, ...]) -> None:
    """A Wan2.2 A14B folder's two experts: ``transformer_2`` and ``boundary_ratio`` come together, the ratio in
    (0, 1), and both experts share one architecture (what the plan and the memory estimate count twice)."""
    ratio, second = index.get("boundary_ratio"), "transformer_2" in components
    if second != (ratio is not None):
        raise PipelineFolderError(f"{folder}/model_index.json has {'transformer_2' if second else 'boundary_ratio'} "
                                  f"without {'boundary_ratio' if second else 'transformer_2'}: a two-expert Wan2.2 "
                                  f"folder needs both (as WanPipeline.save_pretrained writes them)")
    if not second:
        return
    if not isinstance(ratio, int | float) or not 0 < ratio < 1:
        raise PipelineFolderError(f"{folder}/model_index.json gives boundary_ratio {ratio!r}: write a number in "
                                  f"(0, 1), the share of timesteps the high-noise transformer takes (0.875 for A14B)")
    first, other = (_read_json(folder / part / "config.json", folder, f"the {part} config")
                    for part in ("transformer", "transformer_2"))
    ignored = ("_name_or_path", "_diffusers_version")
    if {k: v for k, v in first.items() if k not in ignored} != {k: v for k, v in other.items() if k not in ignored}:
        raise PipelineFolderError(f"{folder}/transformer_2/config.json differs from transformer/config.json: "
                                  f"Spotlight trains two-expert folders whose experts share one architecture")


def read_pipeline_folder(path: str | Path) -> PipelineFolder:
    """The pipeline folder at ``path`` (read once per process); PipelineFolderError in one line otherwise."""
    return _read(Path(path).expanduser().resolve())
