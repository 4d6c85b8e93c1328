"""ImageReward from a checkpoint in the release's layout (ImageReward.pt + med_config.json), random tiny weights.

The expected score is BLIP's forward written out here on the release's state dict: the timm-style ViT (fused
qkv split by heads, pre-norm blocks, LayerNorm eps 1e-6), then BERT with self-attention over the padded
prompt and cross-attention over all image tokens (post-norm, eps from med_config.json), the [CLS] state
through the five Linear layers, and the release's mean/std. A wrong rename or config in the reward's load
into transformers' BLIP fails it.
"""

import pytest
import torch
from transformers import AutoTokenizer

from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.models.cache import forget_all
from spotlight.rewards.models.imagereward import ImageRewardReward
from spotlight.rewards.models.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection

F = torch.nn.functional


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, key_mask=None) -> torch.Tensor:
    batch, length, width = q.shape
    q, k, v = (x.reshape(batch, -1, heads, width // heads).transpose(1, 2) for x in (q, k, v))
    scores = q @ k.transpose(-1, -2) / (width // heads) ** 0.5
    if key_mask is not None:
        scores = scores.masked_fill(~key_mask[:, None, None, :], float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, width)


def _lin(x, state, name):
    return F.linear(x, state[name + ".weight"], state[name + ".bias"])


def _ln(x, state, name, eps):
    return F.layer_norm(x, (x.shape[-1],), state[name + ".weight"], state[name + ".bias"], eps)


@torch.no_grad()
def blip_imagereward(state: dict, med: dict, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor):
    v = "blip.visual_encoder."
    width = state[v + "patch_embed.proj.weight"].shape[0]
    x = F.conv2d(pixels, state[v + "patch_embed.proj.weight"], state[v + "patch_embed.proj.bias"],
                 stride=state[v + "patch_embed.proj.weight"].shape[-1]).flatten(2).transpose(1, 2)
    x = torch.cat([state[v + "cls_token"].expand(x.shape[0], -1, -1), x], dim=1) + state[v + "pos_embed"]
    blocks = len({name.split(".")[3] for name in state if name.startswith(v + "blocks.")})
    for i in range(blocks):
        b = f"{v}blocks.{i}."
        q, k, val = _lin(_ln(x, state, b + "norm1", 1e-6), state, b + "attn.qkv").chunk(3, dim=-1)
        x = x + _lin(_attention(q, k, val, width // 64), state, b + "attn.proj")
        x = x + _lin(F.gelu(_lin(_ln(x, state, b + "norm2", 1e-6), state, b + "mlp.fc1")), state, b + "mlp.fc2")
    image = _ln(x, state, v + "norm", 1e-6)
    t, eps, heads = "blip.text_encoder.", med["layer_norm_eps"], med["num_attention_heads"]
    h = state[t + "embeddings.word_embeddings.weight"][ids] + state[t + "embeddings.position_embeddings.weight"][
        : ids.shape[1]]
    h = _ln(h, state, t + "embeddings.LayerNorm", eps)
    for i in range(med["num_hidden_layers"]):
        layer = f"{t}encoder.layer.{i}."
        for attention, source, key_mask in (("attention", None, mask.bool()), ("crossattention", image, None)):
            a = layer + attention
            context = h if source is None else source
            out = _attention(_lin(h, state, a + ".self.query"), _lin(context, state, a + ".self.key"),
                             _lin(context, state, a + ".self.value"), heads, key_mask)
            h = _ln(_lin(out, state, a + ".output.dense") + h, state, a + ".output.LayerNorm", eps)
        inner = F.gelu(_lin(h, state, layer + "intermediate.dense"))
        h = _ln(_lin(inner, state, layer + "output.dense") + h, state, layer + "output.LayerNorm", eps)
    r = h[:, 0]
    for index in (0, 2, 4, 6, 7):
        r = _lin(r, state, f"mlp.layers.{index}")
    return (r.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072


def test_imagereward_equals_blips_forward_on_the_release_state_dict(tiny_imagereward):
    checkpoint, tokenizer, med = tiny_imagereward
    forget_all()
    reward = build_reward(RewardSection(name="imagereward", batch_size=2, models={
        "imagereward": str(checkpoint), "imagereward_tokenizer": str(tokenizer)}))
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["a photo of a red clock", "a black dog on the bench", "the sign that says hello world"]
    out = guarded_score(reward, images, prompts)
    assert out.valid.all() and not out.strict.any()
    pixels = (images - torch.tensor(OPENAI_CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(OPENAI_CLIP_STD).view(1, 3, 1, 1)
    tokens = AutoTokenizer.from_pretrained(tokenizer)(prompts, padding="max_length", max_length=35,
                                                      return_tensors="pt")
    expected = blip_imagereward(torch.load(checkpoint, weights_only=True), med, pixels, tokens["input_ids"],
                                tokens["attention_mask"])
    assert expected.std() > 0.1
    torch.testing.assert_close(out.rewards, expected, atol=1e-4, rtol=1e-4)


def test_a_wrong_or_missing_imagereward_checkpoint_fails_in_one_line(tiny_imagereward, tmp_path):
    checkpoint, tokenizer, _ = tiny_imagereward
    forget_all()
    with pytest.raises(RewardError, match=r"reward.models.imagereward: .*none.pt does not exist; expected ImageReward"):
        ImageRewardReward.from_files(str(tmp_path / "none.pt"), str(tokenizer))
    other = tmp_path / "ImageReward.pt"
    (tmp_path / "med_config.json").write_text((checkpoint.parent / "med_config.json").read_text())
    torch.save({"visual.conv1.weight": torch.zeros(2)}, other)
    with pytest.raises(RewardError, match=r"does not hold ImageReward's weights; expected ImageReward.pt") as error:
        ImageRewardReward.from_files(str(other), str(tokenizer))
    assert "\n" not in str(error.value)
    state = torch.load(checkpoint, weights_only=True)
    del state["mlp.layers.7.bias"]
    torch.save(state, other)
    forget_all()
    with pytest.raises(RewardError, match=r"weights missing \['mlp.layers.7.bias'\]"):
        ImageRewardReward.from_files(str(other), str(tokenizer))
    with pytest.raises(RewardError, match="reward.models.imagereward_tokenizer is not set"):
        ImageRewardReward.from_files(str(checkpoint), None)
