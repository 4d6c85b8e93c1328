"""TinyDiT: a small Diffusion Transformer that trains on a CPU.

Patchified image tokens and prompt tokens share one sequence (in-context joint attention, as in
MMDiT / Qwen-Image, with shared weights), so relations such as "left of" are learned by attention
rather than squeezed through a pooled vector. The timestep and the pooled prompt condition every
block through adaLN-Zero (DiT, Peebles & Xie 2023): each block starts as the identity, which keeps
early training stable. Attention goes through ``self.attention_fn`` so that sequence parallelism can
be applied from outside (see ``spotlight.models.attention``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from spotlight.models.attention import AttentionFn, sdpa_attention
from spotlight.models.policy import to_images
from spotlight.task_presets import get_task

ARCHITECTURE = "TinyDiT"  # what model.json names, for spotlight.models.rebuild


@dataclass(frozen=True)
class TinyDiTConfig:
    """Architecture of a TinyDiT; saved next to every checkpoint so that it can be rebuilt."""

    image_size: int = 32
    in_channels: int = 3
    patch_size: int = 4
    dim: int = 128
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    vocab_size: int = 32
    max_text_len: int = 12
    image_width: int | None = None  # None: square images of image_size; else image_size is the height
    task: str = "shapes"  # whose tokenizer (spotlight.task_presets) encodes this model's prompts

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size or self.width % self.patch_size:
            raise ValueError(
                f"model.patch_size {self.patch_size} must divide model.image_size {self.image_size} "
                f"and model.image_width {self.width}"
            )
        if self.dim % self.num_heads:
            raise ValueError(f"model.num_heads {self.num_heads} must divide model.dim {self.dim}")

    @property
    def width(self) -> int:
        return self.image_size if self.image_width is None else self.image_width

    @property
    def grid(self) -> tuple[int, int]:
        """Patches per column and per row."""
        return (self.image_size // self.patch_size, self.width // self.patch_size)

    @property
    def num_image_tokens(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        return (self.in_channels, self.image_size, self.width)

    def to_dict(self) -> dict:
        return asdict(self)


def sincos_2d(grid: int, dim: int, grid_width: int | None = None) -> torch.Tensor:
    """Fixed 2-D sine-cosine position embedding, (grid*grid_width, dim): half the channels per axis.

    ``grid`` rows by ``grid_width`` columns (square when None), row-major like the patch sequence.
    """
    quarter = dim // 4
    omega = 1.0 / (10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter))
    rows = torch.arange(grid, dtype=torch.float64)
    columns = torch.arange(grid if grid_width is None else grid_width, dtype=torch.float64)
    ys, xs = torch.meshgrid(rows, columns, indexing="ij")

    def embed(pos: torch.Tensor) -> torch.Tensor:
        angles = pos.reshape(-1, 1) * omega[None]
        return torch.cat([angles.sin(), angles.cos()], dim=1)

    return torch.cat([embed(ys), embed(xs)], dim=1).float()


def timestep_embedding(sigma: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding (B, dim) of the noise level, scaled to the DDPM-style range [0, 1000]."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=sigma.device) / half)
    angles = (sigma.float() * 1000.0)[:, None] * freqs[None]
    return torch.cat([angles.cos(), angles.sin()], dim=1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None]) + shift[:, None]


class SelfAttention(nn.Module):
    """Multi-head self-attention whose kernel is supplied per call (single device or SP)."""

    def __init__(self, dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, attention_fn: AttentionFn) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, dim // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, N, Dh)
        out = attention_fn(q, k, v, mask)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class DiTBlock(nn.Module):
    """Pre-norm transformer block with adaLN-Zero modulation from the conditioning vector."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.attn = SelfAttention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, dim))
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        nn.init.zeros_(self.modulation[1].weight)
        nn.init.zeros_(self.modulation[1].bias)

    def forward(
        self, x: torch.Tensor, cond: torch.Tensor, mask: torch.Tensor | None, attention_fn: AttentionFn
    ) -> torch.Tensor:
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = self.modulation(cond).chunk(6, dim=1)
        x = x + gate_a[:, None] * self.attn(modulate(self.norm1(x), shift_a, scale_a), mask, attention_fn)
        x = x + gate_m[:, None] * self.mlp(modulate(self.norm2(x), shift_m, scale_m))
        return x


class TinyDiT(nn.Module):
    """Velocity model v(x_sigma, sigma, prompt) for images (B, C, H, W) and prompt token ids (B, L).

    Token id 0 is padding: padded prompt tokens are masked out as attention keys and excluded from
    the pooled prompt vector.
    """

    def __init__(self, config: TinyDiTConfig) -> None:
        super().__init__()
        self.config = config
        dim, patch = config.dim, config.patch_size
        self.attention_fn: AttentionFn = sdpa_attention
        self.patch_embed = nn.Conv2d(config.in_channels, dim, kernel_size=patch, stride=patch)
        self.register_buffer(
            "image_pos", sincos_2d(config.grid[0], dim, config.grid[1])[None], persistent=False
        )
        self.token_embed = nn.Embedding(config.vocab_size, dim)
        self.text_pos = nn.Parameter(torch.zeros(1, config.max_text_len, dim))
        self.time_mlp = nn.Sequential(nn.Linear(dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.prompt_proj = nn.Linear(dim, dim)
        self.blocks = nn.ModuleList(DiTBlock(dim, config.num_heads, config.mlp_ratio) for _ in range(config.depth))
        self.final_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.final_modulation = nn.Sequential(nn.SiLU(), nn.Linear(dim, 2 * dim))
        self.final_linear = nn.Linear(dim, patch * patch * config.in_channels)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        nn.init.normal_(self.token_embed.weight, std=0.02)
        nn.init.normal_(self.text_pos, std=0.02)
        for block in self.blocks:  # adaLN-Zero: every block starts as the identity
            nn.init.zeros_(block.modulation[1].weight)
            nn.init.zeros_(block.modulation[1].bias)
        for layer in (self.final_modulation[1], self.final_linear):
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def embed(
        self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return (sequence (B, L+N, D) = [prompt tokens; image tokens], cond (B, D), key mask (B, L+N))."""
        text_mask = tokens != 0
        text = self.token_embed(tokens) + self.text_pos[:, : tokens.shape[1]]
        pooled = (text * text_mask[..., None]).sum(1) / text_mask.sum(1, keepdim=True).clamp(min=1)
        image = self.patch_embed(x).flatten(2).transpose(1, 2) + self.image_pos
        cond = self.time_mlp(timestep_embedding(sigma, self.config.dim).to(x.dtype)) + self.prompt_proj(pooled)
        image_mask = torch.ones(x.shape[0], image.shape[1], dtype=torch.bool, device=x.device)
        return torch.cat([text, image], dim=1), cond, torch.cat([text_mask, image_mask], dim=1)

    def run_blocks(self, sequence: torch.Tensor, cond: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Apply every transformer block; ``sequence`` may be a sequence-parallel shard."""
        for block in self.blocks:
            sequence = block(sequence, cond, mask, self.attention_fn)
        return sequence

    def unpatchify(self, image_tokens: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        """Final adaLN layer and patch-to-pixel reshaping: (B, N, D) -> (B, C, H, W)."""
        cfg = self.config
        shift, scale = self.final_modulation(cond).chunk(2, dim=1)
        patches = self.final_linear(modulate(self.final_norm(image_tokens), shift, scale))
        (rows, columns), p, c = cfg.grid, cfg.patch_size, cfg.in_channels
        patches = patches.reshape(-1, rows, columns, p, p, c)
        return patches.permute(0, 5, 1, 3, 2, 4).reshape(-1, c, rows * p, columns * p)

    def forward(self, x: torch.Tensor, sigma: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Predict the velocity (B, C, H, W) for latents x (B, C, H, W) at noise levels sigma (B,)."""
        sequence, cond, mask = self.embed(x, sigma, tokens)
        sequence = self.run_blocks(sequence, cond, mask)
        return self.unpatchify(sequence[:, tokens.shape[1] :], cond)

    # --- the policy interface (spotlight.models.policy): every weight is trained, so every weight moves ---

    @property
    def latent_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of the images it denoises (no VAE: latents are pixels in [-1, 1])."""
        return self.config.latent_shape

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Every parameter: a TinyDiT is trained in full."""
        return list(self.parameters())

    def broadcast_state(self) -> dict[str, torch.Tensor]:
        """The whole state dict, detached: a TinyDiT has no frozen base to leave out."""
        return {name: tensor.detach() for name, tensor in self.state_dict().items()}

    def load_broadcast_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Copy a state from :meth:`broadcast_state` (strict: every key, every shape)."""
        self.load_state_dict({name: torch.as_tensor(tensor) for name, tensor in state.items()})

    def describe(self) -> dict[str, Any]:
        """JSON that rebuilds the architecture: its name and config."""
        return {"architecture": ARCHITECTURE, "config": self.config.to_dict()}

    def tokenize(self, prompts: Sequence[str], guided: bool = True) -> torch.Tensor:
        """Its task's token ids (B, max_text_len); a TinyDiT has no guidance, so ``guided`` changes nothing."""
        return get_task(self.config.task).tokenize(prompts, self.config.max_text_len)

    def decode_images(self, latents: torch.Tensor) -> torch.Tensor:
        """No VAE: its latents are the images, in [-1, 1]."""
        return to_images(latents)

    def prompt_conditioning(self, prompts: Sequence[str]) -> None:
        """Nothing: its token ids are the whole conditioning."""
        return None

    def adopt_prompt_conditioning(self, conditioning: Any | None) -> None:
        """Nothing to take: every process tokenizes alike."""

    def schedule(self) -> None:
        """None: it samples on Spotlight's own sigma schedule."""
        return None

    def save_for_diffusers(self, directory: str | Path) -> None:
        """None: a TinyDiT has no format other tools load; its checkpoint is the model directory."""
        return None

    @property
    def shard_root(self) -> nn.Module:
        """Itself: its blocks are its own ``nn.ModuleList``."""
        return self
