"""diffusers transformers (SD3, FLUX, Qwen-Image) behind the policy interface (``spotlight.models.policy``), with LoRA.

``DiffusersPolicy(x, sigma, cond) -> velocity`` takes latents (B, C, H, W), noise levels sigma (B,) and
prompt embeddings, and returns the velocity (B, C, H, W) in Spotlight's convention
(``x_sigma = (1 - sigma) x0 + sigma noise``, ``v = noise - x0``, sampling runs sigma 1 -> 0), so the
sampler and the GRPO update use it exactly as they use a TinyDiT. All three families were trained with
that same rectified-flow target and all three embed the noise level as the DDPM-style timestep
``1000 * sigma``; they differ only in how that number and the latents are handed over, which is
what this module hides:

============  ==========================  ===========================  ==================================
family        latents the model takes     ``timestep`` argument        extra inputs
============  ==========================  ===========================  ==================================
sd3           (B, C, H, W), patchified    ``1000 * sigma``             pooled prompt vector
              inside the model
flux          2x2-packed (B, HW/4, 4C)    ``sigma`` (x1000 inside)     pooled vector, RoPE ids of text
                                                                       and image tokens, guidance scale
                                                                       (guidance-distilled checkpoints)
qwen-image    2x2-packed (B, HW/4, 4C)    ``sigma`` (x1000 inside)     text mask, packed grid size
============  ==========================  ===========================  ==================================

(The FLUX and Qwen-Image pipelines likewise pass ``timestep / 1000``, i.e. sigma.) Packing follows the
pipelines' ``_pack_latents``: token (i, j) holds the 2x2 patch of rows 2i..2i+1 and columns 2j..2j+1,
channel-major.

LoRA comes from peft through diffusers' ``add_adapter``; the base weights are frozen, LoRA's B
matrices start at zero (so the initial policy *is* the base model), and the reference policy of the
KL term is the same module with the adapter disabled: no second copy of a multi-billion-parameter model.
Checkpoints and weight broadcasts hold only the LoRA tensors (``broadcast_state``); the base is named by
the config (a folder, or ``tiny`` with ``init_seed``) and rebuilt wherever it is needed.

Sequence parallelism (Ulysses). ``policy.attention_fn = fn`` routes the joint (text + image)
attention of every block through ``fn(q, k, v, key_padding_mask)`` on (B, H, N, Dh), the interface of
``spotlight.models.attention`` that ``spotlight.models.ulysses.UlyssesAttention`` implements; with
plain SDPA it reproduces diffusers' own processors (tested). ``route_attention(fn, sequence_shards=P)``
is the same for blocks that see one rank's token shard: the token-sharding half, applied from outside
by ``spotlight.models.pipelines.sequence_parallel`` (FLUX and Qwen-Image). diffusers' own context parallelism does
not serve here: in diffusers 0.42 it fails on a CPU before any work (it computes
``rank % torch.accelerator.device_count()``, which is 0 there), SD3 has no ``_cp_plan``, and its device
mesh is fixed when parallelism is enabled, whereas the elastic runtime re-forms groups of other sizes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import save_file

from spotlight.models.attention import AttentionFn
from spotlight.models.pipelines.family_config import DiffusersPolicyConfig, Family
from spotlight.models.pipelines.inputs import PromptEmbeddings, latent_channels, transformer_velocity
from spotlight.models.pipelines.joint_attention import JointAttentionProcessor
from spotlight.models.pipelines.loading import DiffusersLoadError, build_tiny_transformer, load_transformer
from spotlight.models.pipelines.text_encoder import TokenTextEncoder
from spotlight.models.policy import to_images
from spotlight.models.weight_payload import WeightPayload, unpack_into
from spotlight.task_presets import get_task

if TYPE_CHECKING:
    from diffusers.models.modeling_utils import ModelMixin

LORA_FORMAT = "spotlight-lora/1"
ADAPTER_NAME = "spotlight"
ARCHITECTURE = "DiffusersPolicy"  # what model.json names, for spotlight.models.rebuild


class DiffusersPolicy(nn.Module):
    """A diffusers transformer with a LoRA adapter: ``forward(x, sigma, cond) -> velocity`` like TinyDiT.

    Only the LoRA weights are trainable, in float32 over a base of ``config.dtype`` (``finetune: full``:
    every transformer weight, kept in float32). ``reference()``
    is the frozen base model (the adapter disabled), for the KL term of the GRPO update. ``cond`` is
    ``PromptEmbeddings`` or, with a ``text_encoder``, token ids (B, L) that it encodes.
    """

    def __init__(self, transformer: ModelMixin, config: DiffusersPolicyConfig,
                 text_encoder: TokenTextEncoder | None = None) -> None:
        super().__init__()
        self.config = config
        self.family: Family = config.family
        self.transformer = transformer
        self.text_encoder = text_encoder
        self._default_processors = dict(transformer.attn_processors)
        self._attention_fn: AttentionFn | None = None
        self._lora_by_name: list[nn.Parameter] | None = None  # the adapter's tensors, found at the first disable
        self._lora_keys_checked = False  # lora_parameters' names compared with peft's once
        transformer.requires_grad_(False)
        if config.finetune == "lora":
            self._add_lora(transformer, config)
        else:  # full fine-tuning: every transformer weight, in float32 (from_config loads it so)
            transformer.requires_grad_(True)
        if config.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        if config.compile:  # after LoRA: the blocks compile with their adapters in them
            compile_blocks(transformer)
        self.channels = latent_channels(self.family, transformer)

    def _add_lora(self, transformer: ModelMixin, config: DiffusersPolicyConfig) -> None:
        from peft import LoraConfig

        lora = LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha,
                          target_modules=list(config.target_modules), init_lora_weights=True)
        try:
            transformer.add_adapter(lora, adapter_name=ADAPTER_NAME)
        except ValueError as error:
            raise ValueError(
                f"lora_target_modules {list(config.target_modules)} match no layer of {type(transformer).__name__} "
                f"({str(error).splitlines()[0]}): name Linear layers such as attn.to_q"
            ) from None
        # LoRA trains in float32 whatever the base dtype: Adam's small updates vanish in bfloat16
        # weights. peft casts each LoRA input to the LoRA dtype and the sum back to the base dtype.
        for parameter in self.trainable_parameters():
            parameter.data = parameter.data.float()

    @property
    def weights_dtype(self) -> torch.dtype:
        """The dtype the transformer's weights are kept in: ``config.dtype``, float32 when fully fine-tuned."""
        return torch.float32 if self.config.finetune == "full" else self.config.torch_dtype

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """torch.autocast to ``config.dtype`` when asked for, or when full fine-tuning keeps float32 weights."""
        compute = self.config.torch_dtype
        wanted = self.config.autocast or (self.config.finetune == "full" and compute != torch.float32)
        if not wanted:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=compute)

    @classmethod
    def from_config(cls, config: DiffusersPolicyConfig) -> DiffusersPolicy:
        """Build the transformer (tiny and random, or loaded) in ``config.dtype`` and add the LoRA adapter.

        With ``init_seed`` every random draw (transformer, text encoder, LoRA A matrices) comes from
        that seed on a forked RNG, so two processes build bit-identical policies and the caller's
        random stream is left as it was.
        """
        if config.init_seed is None:
            return cls._build(config)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.init_seed)
            return cls._build(config)

    @classmethod
    def _build(cls, config: DiffusersPolicyConfig) -> DiffusersPolicy:
        dtype = torch.float32 if config.finetune == "full" else config.torch_dtype
        if config.tiny:
            transformer = build_tiny_transformer(config.family, config.tiny_overrides)
            if dtype != torch.float32:
                transformer = transformer.to(dtype)
        else:
            transformer = load_transformer(config.family, config.pretrained or "", dtype)
        text_encoder = None
        if config.vocab_size is not None:
            family_config = transformer.config
            pooled = None if config.family == "qwen-image" else int(family_config.pooled_projection_dim)
            text_encoder = TokenTextEncoder(config.vocab_size, config.max_text_len,
                                            int(family_config.joint_attention_dim), pooled)
        return cls(transformer, config, text_encoder)

    @classmethod
    def from_pretrained(cls, path_or_id: str, family: Family, **fields: Any) -> DiffusersPolicy:
        """``from_config`` for a local diffusers folder or Hub id; ``fields`` are other config fields."""
        return cls.from_config(DiffusersPolicyConfig(family=family, pretrained=path_or_id, **fields))

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the latents this policy samples, for ``spotlight.diffusion.sampler.sample``."""
        size = self.config.resolved_latent_size
        return (self.channels, size, size)

    @property
    def prompt_dims(self) -> tuple[int, int | None]:
        """(D, P): the width of the prompt embeddings and of the pooled vector (None when unused)."""
        config = self.transformer.config
        pooled = getattr(config, "pooled_projection_dim", None)  # SD3 and FLUX only
        width = getattr(config, "joint_attention_dim", None) or config.text_dim  # Wan names it text_dim
        return int(width), None if self.family == "qwen-image" or pooled is None else int(pooled)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, cond: PromptEmbeddings | torch.Tensor) -> torch.Tensor:
        """Predict the velocity (B, C, H, W) for latents x (B, C, H, W) at noise levels sigma (B,)."""
        if isinstance(cond, torch.Tensor):
            if self.text_encoder is None:
                raise ValueError("this policy has no text encoder: pass PromptEmbeddings, or build it with "
                                 "task and vocab_size set to take token ids")
            cond = self.text_encoder(cond.to(self.text_encoder.position.device))
        device = next(self.transformer.parameters()).device  # latents from the loop may sit on the CPU
        with self.autocast(device):
            velocity = transformer_velocity(self.transformer, self.family, x.to(device), sigma.to(device), cond,
                                            self.config.guidance_scale)
        return velocity.to(x.device)

    # --- the reference policy -------------------------------------------------------------------

    @contextlib.contextmanager
    def adapter_disabled(self) -> Iterator[None]:
        """Run the base model inside the block; requires_grad of the LoRA weights is restored after.

        (peft's enable/disable also toggles requires_grad, which would otherwise make a frozen adapter
        trainable again.)
        """
        if self.config.finetune != "lora":
            raise ValueError("a fully fine-tuned policy has no adapter to disable: build the base again "
                             "(base_policy.build_policy) for a reference")
        if self._lora_by_name is None:  # found once: named_parameters walks every module
            self._lora_by_name = [parameter for name, parameter in self.named_parameters() if "lora_" in name]
        flags = [parameter.requires_grad for parameter in self._lora_by_name]
        self.transformer.disable_adapters()
        try:
            yield
        finally:
            self.transformer.enable_adapters()
            for parameter, flag in zip(self._lora_by_name, flags, strict=True):
                parameter.requires_grad_(flag)

    def reference(self) -> ReferencePolicy:
        """The reference policy for the KL term: this model with the adapter disabled (shares weights)."""
        return ReferencePolicy(self)

    # --- LoRA weights ---------------------------------------------------------------------------

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The parameters an optimizer steps: the LoRA A and B matrices (``finetune: full``: every transformer
        weight). Chosen by role, not by ``requires_grad``, so a frozen copy lists the same tensors in the same
        order, which is what an EMA or a soft update pairs up."""
        if self.config.finetune == "full":
            return list(self.transformer.parameters())
        return [parameter for name, parameter in self.transformer.named_parameters() if ".lora_" in name]

    def lora_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA tensors in peft's adapter-name-free key format, detached CPU copies."""
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(self.transformer, adapter_name=ADAPTER_NAME)
        return {name: tensor.detach().cpu().contiguous().clone() for name, tensor in state.items()}

    def lora_parameters(self) -> dict[str, nn.Parameter]:
        """The LoRA parameters themselves, under the keys of :meth:`lora_state_dict`: live tensors, no copy.

        What a process that maps shared weights needs: it points these parameters at the shared
        tensors (``parameter.data = tensor``) instead of copying, so new weights written in place reach it.
        """
        marker = f".{ADAPTER_NAME}."
        parameters = {name.replace(marker, "."): parameter for name, parameter in self.transformer.named_parameters()
                      if ".lora_" in name and marker in name}
        if not self._lora_keys_checked:  # once: peft's own key list (references, no copies)
            from peft import get_peft_model_state_dict

            if parameters.keys() != get_peft_model_state_dict(self.transformer, adapter_name=ADAPTER_NAME).keys():
                raise RuntimeError("peft's LoRA parameter names no longer match its state-dict keys: update "
                                   "DiffusersPolicy.lora_parameters for this peft version")
            self._lora_keys_checked = True
        return parameters

    def trained_tensors(self) -> dict[str, torch.Tensor]:
        """What changes under training, live: the LoRA tensors (`lora_parameters`), or (``finetune: full``) every
        transformer parameter, under the names of :meth:`broadcast_state` (`spotlight.models.weight_payload`)."""
        if self.config.finetune == "full":
            return dict(self.transformer.named_parameters())
        return dict(self.lora_parameters())

    def load_lora_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy LoRA tensors (as from :meth:`lora_state_dict`) into the adapter; keys and shapes must match.

        Shapes are compared as metadata and the tensors copied in with one ``_foreach_copy_`` (cast to the
        adapter's float32), so weights already on the policy's device never pass through the host.
        """
        targets = self.lora_parameters()
        expected = {name: tuple(tensor.shape) for name, tensor in targets.items()}
        given = {name: tuple(tensor.shape) for name, tensor in state.items()}
        if expected != given:
            missing, extra = sorted(set(expected) - set(given)), sorted(set(given) - set(expected))
            shapes = sorted(n for n in set(expected) & set(given) if expected[n] != given[n])
            first = (missing or extra or shapes)[0]
            raise ValueError(
                f"LoRA weights do not fit this policy ({len(missing)} missing, {len(extra)} unexpected, "
                f"{len(shapes)} of another shape, e.g. {first}): build the policy with the family, "
                f"lora_rank and lora_target_modules the weights were trained with"
            )
        with torch.no_grad():
            torch._foreach_copy_(list(targets.values()), [torch.as_tensor(state[name]) for name in targets])

    def lora_metadata(self) -> dict[str, str]:
        """What a LoRA file records about the policy it fits (safetensors metadata is str -> str)."""
        return {
            "format": LORA_FORMAT,
            "family": self.family,
            "lora_rank": str(self.config.lora_rank),
            "lora_alpha": str(self.config.lora_alpha),
            "lora_target_modules": json.dumps(list(self.config.target_modules)),
        }

    def save_lora(self, path: str | Path) -> Path:
        """Write the LoRA weights to one safetensors file, atomically (temp file + rename); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(handle)
        try:
            save_file(self.lora_state_dict(), staging, metadata=self.lora_metadata())
            os.replace(staging, path)
        finally:
            if os.path.exists(staging):
                os.remove(staging)
        return path

    def load_lora(self, path: str | Path) -> None:
        """Load LoRA weights written by :meth:`save_lora`, refusing a file made for another policy shape."""
        path = Path(path)
        if not path.is_file():
            raise DiffusersLoadError(f"LoRA file {path} does not exist: pass a file written by save_lora")
        try:
            with safe_open(str(path), framework="pt") as handle:
                metadata = handle.metadata() or {}
                state = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        except (OSError, ValueError, RuntimeError) as error:
            raise DiffusersLoadError(f"LoRA file {path} is unreadable ({type(error).__name__}: {error})") from None
        mine = self.lora_metadata()
        for field in ("family", "lora_rank", "lora_alpha", "lora_target_modules"):
            if field in metadata and metadata[field] != mine[field]:
                raise ValueError(
                    f"LoRA file {path} was trained with {field}={metadata[field]} but this policy has "
                    f"{field}={mine[field]}: build the policy with {field}={metadata[field]}"
                )
        self.load_lora_state_dict(state)

    def save_for_diffusers(self, directory: str | Path) -> Path:
        """Write what diffusers loads this policy from into ``directory``; returns its path.

        LoRA: ``pytorch_lora_weights.safetensors``, so that ``DiffusionPipeline.from_pretrained(base)
        .load_lora_weights(directory)`` gives this policy; full fine-tuning: a ``transformer/`` folder that
        ``from_pretrained`` loads (``spotlight.models.pipelines.export``). Every checkpoint holds it.
        """
        from spotlight.models.pipelines.export import save_diffusers_lora, save_transformer_folder

        if self.config.finetune == "full":
            return save_transformer_folder(self.transformer, directory)
        return save_diffusers_lora(self.transformer, self.family, ADAPTER_NAME, directory)

    # --- the policy interface: what the loop, checkpoints and the runtime use ----------------------

    def tokenize(self, prompts: Sequence[str], guided: bool = True) -> torch.Tensor:
        """Its task's token ids, which its frozen text encoder embeds (a pipeline folder overrides this)."""
        return get_task(self.config.task).tokenize(prompts, self.config.max_text_len)

    def decode_images(self, latents: torch.Tensor) -> torch.Tensor:
        """A transformer alone denoises the task's pixels: its latents are the images (a folder's VAE overrides)."""
        return to_images(latents)

    def prompt_conditioning(self, prompts: Sequence[str]) -> Any | None:
        """Nothing: its task's token ids are the whole conditioning (a pipeline folder's cache overrides this)."""
        return None

    def adopt_prompt_conditioning(self, conditioning: Any | None) -> None:
        """Nothing to take (a pipeline folder's cache overrides this)."""

    def schedule(self) -> Any | None:
        """None: Spotlight's sigma schedule (a pipeline folder's scheduler overrides this)."""
        return None

    @property
    def shard_root(self) -> nn.Module:
        """The transformer: the text encoders and VAE are frozen and shared with the other versions."""
        return self.transformer

    def broadcast_state(self) -> dict[str, torch.Tensor]:
        """What changes under training, so all that a checkpoint or a spot device needs: the LoRA tensors,
        or (full fine-tuning) every transformer weight, as detached CPU copies."""
        if self.config.finetune == "lora":
            return self.lora_state_dict()
        return {name: tensor.detach().cpu().clone() for name, tensor in self.transformer.state_dict().items()}

    def load_broadcast_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Take the tensors of :meth:`broadcast_state` of a policy built from the same config, or a `WeightPayload`
        of its trained tensors (one copy of its buffer to the device, then one ``_foreach_copy_``)."""
        if isinstance(state, WeightPayload):
            unpack_into(self, state)
            return
        tensors = {name: torch.as_tensor(tensor) for name, tensor in state.items()}
        if self.config.finetune == "lora":
            self.load_lora_state_dict(tensors)
            return
        result = self.transformer.load_state_dict(tensors, strict=False)
        if result.missing_keys or result.unexpected_keys:
            first = (result.missing_keys or result.unexpected_keys)[0]
            raise ValueError(f"transformer weights do not fit this policy ({len(result.missing_keys)} missing, "
                             f"{len(result.unexpected_keys)} unexpected, e.g. {first}): load weights of the same "
                             f"pipeline folder")

    def describe(self) -> dict[str, Any]:
        """JSON that rebuilds the base: the config, whose ``pretrained`` folder or ``init_seed`` names it.

        A tiny policy without ``init_seed`` drew its base from the global RNG and cannot be named, so it
        is refused here rather than saved as a checkpoint that would load another base.
        """
        config = self.config
        if config.tiny and config.init_seed is None:
            raise ValueError("a tiny diffusers policy without init_seed cannot be rebuilt from a checkpoint: "
                             "set init_seed in its config")
        base = {"pretrained": config.pretrained} if config.pretrained else {"tiny": True, "init_seed": config.init_seed}
        return {"architecture": ARCHITECTURE, "config": config.model_dump(mode="json"), "base": base}

    # --- attention routing (sequence parallelism) -----------------------------------------------

    @property
    def attention_fn(self) -> AttentionFn | None:
        """The ``AttentionFn`` the joint attention runs through; None = diffusers' own processors."""
        return self._attention_fn

    @attention_fn.setter
    def attention_fn(self, attention_fn: AttentionFn | None) -> None:
        self.route_attention(attention_fn)

    def route_attention(self, attention_fn: AttentionFn | None, sequence_shards: int = 1) -> None:
        """Send every block's joint attention through ``attention_fn`` (None: diffusers' own processors).

        ``sequence_shards`` > 1 when the blocks see one rank's token shard (see ``JointAttentionProcessor``).
        """
        self._attention_fn = attention_fn
        if attention_fn is None:
            self.transformer.set_attn_processor(copy.copy(self._default_processors))
        else:
            self.transformer.set_attn_processor(JointAttentionProcessor(self.family, attention_fn, sequence_shards))


class ReferencePolicy:
    """The base model of a :class:`DiffusersPolicy`: calls it with the adapter disabled.

    Not an ``nn.Module`` on purpose: it shares every weight with the policy and must not show up as
    a second copy in a state dict or an optimizer.
    """

    def __init__(self, policy: DiffusersPolicy) -> None:
        self.policy = policy

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, cond: PromptEmbeddings | torch.Tensor) -> torch.Tensor:
        """Velocity (B, C, H, W) of the base model."""
        with self.policy.adapter_disabled():
            return self.policy(x, sigma, cond)


# the ModuleLists of repeated blocks in diffusers' SD3, FLUX and Qwen-Image transformers
BLOCK_LISTS = ("transformer_blocks", "single_transformer_blocks")


def compile_blocks(transformer: nn.Module) -> int:
    """``model.compile``: compile each block of ``transformer``'s block lists in place; how many were.

    A DiT is one block repeated 24-60 times. Compiled per block (as torchtitan does), every block of a kind
    reuses one graph, so compiling takes seconds, and a graph break in the model's glue (patch embedding,
    RoPE ids, the LoRA switch) costs nothing inside the blocks, where the time goes: fused kernels cut the
    launches that make eager micro-batches launch-bound on a GPU. Off by default: the first iteration pays
    the compile, and the gain is to be measured per GPU and model (``benchmarks/gpu/gpu_throughput.py``).

    A transformer without such lists is a ``ValueError`` naming the fix, not a silent eager run.
    """
    compiled = 0
    for name in BLOCK_LISTS:
        blocks = getattr(transformer, name, None)
        if blocks is None:
            continue
        for block in blocks:
            block.compile()
            compiled += 1
    if not compiled:
        raise ValueError(f"model.compile found no transformer_blocks in {type(transformer).__name__}: "
                         "set model.compile false for this model")
    return compiled
