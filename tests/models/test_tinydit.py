import math

import pytest
import torch
from random_models import randomised_tinydit

from spotlight.models.tinydit import TinyDiT, TinyDiTConfig

SMALL = TinyDiTConfig(image_size=8, in_channels=3, patch_size=4, dim=32, depth=2, num_heads=2, vocab_size=16,
                      max_text_len=6)


def randomised(config: TinyDiTConfig = SMALL, seed: int = 0) -> TinyDiT:
    """A model with every parameter random, so that no zero-initialised layer hides a path."""
    return randomised_tinydit(config, seed, 0.3)


def inputs(batch: int = 2, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, SMALL.in_channels, SMALL.image_size, SMALL.image_size, generator=generator)
    sigma = torch.rand(batch, generator=generator)
    return x, sigma


def hand_attention(q, k, v, key_padding_mask):
    """softmax(Q K^T / sqrt(d)) V with masked keys at -inf, written out."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if key_padding_mask is not None:
        scores = scores.masked_fill(~key_padding_mask[:, None, None, :], float("-inf"))
    return scores.softmax(dim=-1) @ v


def test_output_is_a_velocity_of_the_latent_shape() -> None:
    torch.set_num_threads(1)
    model = TinyDiT(TinyDiTConfig())
    x = torch.randn(2, 3, 32, 32)
    out = model(x, torch.tensor([0.3, 0.9]), torch.tensor([[1, 2, 3] + [0] * 9, [4] * 12]))
    assert out.shape == x.shape
    assert model.config.latent_shape == (3, 32, 32)
    assert model.config.num_image_tokens == 64


def test_adaln_zero_init_gives_exactly_zero_velocity_and_identity_blocks() -> None:
    torch.manual_seed(0)
    model = TinyDiT(SMALL)
    x, sigma = inputs()
    tokens = torch.tensor([[1, 2, 3, 0, 0, 0], [5, 0, 0, 0, 0, 0]])
    out = model(x, sigma, tokens)
    assert torch.equal(out, torch.zeros_like(x))
    sequence, cond, mask = model.embed(x, sigma, tokens)
    assert torch.equal(model.run_blocks(sequence, cond, mask), sequence)


def test_default_model_has_between_one_and_five_million_parameters() -> None:
    count = sum(p.numel() for p in TinyDiT(TinyDiTConfig()).parameters())
    assert 1_000_000 <= count <= 5_000_000


def test_trailing_padding_does_not_change_the_output() -> None:
    model = randomised()
    x, sigma = inputs()
    short = torch.tensor([[1, 2, 3], [7, 8, 0]])
    padded = torch.tensor([[1, 2, 3, 0, 0, 0], [7, 8, 0, 0, 0, 0]])
    with torch.no_grad():
        assert torch.allclose(model(x, sigma, short), model(x, sigma, padded), atol=1e-5)


def test_pad_embeddings_do_not_reach_the_output() -> None:
    model = randomised()
    x, sigma = inputs()
    tokens = torch.tensor([[1, 2, 3, 0, 0, 0], [7, 8, 0, 0, 0, 0]])
    with torch.no_grad():
        before = model(x, sigma, tokens)
        model.token_embed.weight[0].add_(5.0)  # the pad token's embedding
        model.text_pos[:, 3:].add_(5.0)  # positions that only ever hold padding here
        after = model(x, sigma, tokens)
    assert torch.allclose(before, after, atol=1e-5)
    with torch.no_grad():  # the same edit at a real token's position does matter (the check can fail)
        model.text_pos[:, 1].add_(5.0)
        assert not torch.allclose(model(x, sigma, tokens), after, atol=1e-3)


def test_an_all_padding_prompt_gives_a_finite_output() -> None:
    model = randomised()
    x, sigma = inputs()
    with torch.no_grad():
        assert torch.isfinite(model(x, sigma, torch.zeros(2, 6, dtype=torch.long))).all()


def test_the_prompt_changes_the_velocity() -> None:
    model = randomised()
    x, sigma = inputs()
    with torch.no_grad():
        first = model(x, sigma, torch.tensor([[1, 2, 3, 0, 0, 0]] * 2))
        second = model(x, sigma, torch.tensor([[1, 2, 4, 0, 0, 0]] * 2))
        reordered = model(x, sigma, torch.tensor([[3, 2, 1, 0, 0, 0]] * 2))
    assert (first - second).abs().max() > 1e-2
    assert (first - reordered).abs().max() > 1e-2  # word order reaches the image (text positions)


def test_the_noise_level_changes_the_velocity() -> None:
    model = randomised()
    x, _ = inputs()
    tokens = torch.tensor([[1, 2, 0, 0, 0, 0]] * 2)
    with torch.no_grad():
        low, high = model(x, torch.full((2,), 0.2), tokens), model(x, torch.full((2,), 0.8), tokens)
    assert (low - high).abs().max() > 1e-2


def test_rows_of_a_batch_are_independent() -> None:
    model = randomised()
    x, sigma = inputs(batch=3)
    tokens = torch.tensor([[1, 2, 0, 0, 0, 0], [3, 4, 5, 0, 0, 0], [6, 0, 0, 0, 0, 0]])
    with torch.no_grad():
        batched = model(x, sigma, tokens)
        alone = model(x[1:2], sigma[1:2], tokens[1:2])
    assert torch.allclose(batched[1:2], alone, atol=1e-5)


def test_a_hand_written_attention_kernel_gives_the_same_output() -> None:
    model = randomised()
    x, sigma = inputs()
    tokens = torch.tensor([[1, 2, 3, 0, 0, 0], [7, 0, 0, 0, 0, 0]])
    calls = []

    def counting_attention(q, k, v, key_padding_mask):
        calls.append(q.shape)
        return hand_attention(q, k, v, key_padding_mask)

    with torch.no_grad():
        reference = model(x, sigma, tokens)
        model.attention_fn = counting_attention
        swapped = model(x, sigma, tokens)
    assert len(calls) == SMALL.depth
    assert calls[0] == (2, SMALL.num_heads, 6 + SMALL.num_image_tokens, SMALL.dim // SMALL.num_heads)
    assert torch.allclose(swapped, reference, atol=1e-5)


def test_unpatchify_inverts_patchify() -> None:
    # With the blocks as the identity (adaLN-Zero), a patch embedding that copies each patch's pixels
    # into the first channels and a final layer that copies them back, the model is the identity map
    # exactly when unpatchify inverts patchify (the right pixel lands in the right place).
    config = TinyDiTConfig(image_size=8, in_channels=2, patch_size=2, dim=16, depth=1, num_heads=2,
                           vocab_size=8, max_text_len=2)
    model = TinyDiT(config)
    with torch.no_grad():
        model.image_pos.zero_()
        model.patch_embed.weight.zero_()
        model.patch_embed.bias.zero_()
        for channel in range(config.in_channels):  # embedding channel (c, i, j) <- patch pixel (c, i, j)
            for i in range(2):
                for j in range(2):
                    model.patch_embed.weight[channel * 4 + i * 2 + j, channel, i, j] = 1.0
        model.final_modulation[1].bias.zero_()
        model.final_norm = torch.nn.Identity()
        # final_linear's output is ordered (i, j, c) per patch (see unpatchify's reshape (p, p, c))
        for channel in range(config.in_channels):
            for i in range(2):
                for j in range(2):
                    model.final_linear.weight[i * 4 + j * 2 + channel, channel * 4 + i * 2 + j] = 1.0
    x = torch.randn(1, 2, 8, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(x, torch.tensor([0.5]), torch.tensor([[1, 0]]))
    assert torch.equal(out, x)


@pytest.mark.parametrize(
    "fields,named",
    [({"image_size": 30, "patch_size": 4}, "patch_size"), ({"dim": 30, "num_heads": 4}, "num_heads")],
)
def test_bad_config_raises_naming_the_field(fields: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TinyDiTConfig(**fields)


def test_a_float64_model_runs_in_float64() -> None:
    # Finite-difference gradient checks need the whole model in float64 (model.double()).
    model = randomised().double()
    x, sigma = inputs()
    with torch.no_grad():
        out = model(x.double(), sigma.double(), torch.tensor([[1, 2, 0, 0, 0, 0]] * 2))
        single = randomised()(x, sigma, torch.tensor([[1, 2, 0, 0, 0, 0]] * 2))
    assert out.dtype == torch.float64
    assert torch.allclose(out.float(), single, atol=1e-4)
