"""HPSv2.1 from a checkpoint in the release's layout (an open_clip CLIP state dict under 'state_dict').

The weights are random, in open_clip's names and shapes for a tiny open_clip config. The expected score is
open_clip's forward written out here on that state dict (torch's MultiheadAttention on the fused in_proj,
as open_clip's blocks run it; class-token and argmax-token pooling; projections as matrix products), so a
wrong rename, split or transpose in the reward's conversion to transformers' CLIPModel fails this test.
"""

import json

import pytest
import torch
from transformers import AutoTokenizer

from spotlight.rewards.base import RewardError, guarded_score
from spotlight.rewards.models.cache import forget_all
from spotlight.rewards.models.hps import HPSReward
from spotlight.rewards.models.pixels import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from spotlight.rewards.registry import build_reward
from spotlight.rewards.section import RewardSection


def _transformer(x: torch.Tensor, state: dict, prefix: str, layers: int, heads: int, mask=None) -> torch.Tensor:
    width = x.shape[-1]
    for i in range(layers):
        p = f"{prefix}transformer.resblocks.{i}."
        attention = torch.nn.MultiheadAttention(width, heads, batch_first=True)
        attention.load_state_dict({"in_proj_weight": state[p + "attn.in_proj_weight"],
                                   "in_proj_bias": state[p + "attn.in_proj_bias"],
                                   "out_proj.weight": state[p + "attn.out_proj.weight"],
                                   "out_proj.bias": state[p + "attn.out_proj.bias"]})
        h = torch.nn.functional.layer_norm(x, (width,), state[p + "ln_1.weight"], state[p + "ln_1.bias"])
        x = x + attention(h, h, h, need_weights=False, attn_mask=mask)[0]
        h = torch.nn.functional.layer_norm(x, (width,), state[p + "ln_2.weight"], state[p + "ln_2.bias"])
        h = torch.nn.functional.linear(h, state[p + "mlp.c_fc.weight"], state[p + "mlp.c_fc.bias"])
        h = torch.nn.functional.gelu(h)
        x = x + torch.nn.functional.linear(h, state[p + "mlp.c_proj.weight"], state[p + "mlp.c_proj.bias"])
    return x


@torch.no_grad()
def open_clip_hps(checkpoint, config: dict, pixels: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """100 x cos(image, text) by open_clip's CLIP forward on the checkpoint's state dict."""
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    vision, text = config["vision_cfg"], config["text_cfg"]
    ln = torch.nn.functional.layer_norm
    x = torch.nn.functional.conv2d(pixels, state["visual.conv1.weight"], stride=vision["patch_size"])
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([state["visual.class_embedding"].expand(x.shape[0], 1, -1), x], dim=1)
    x = ln(x + state["visual.positional_embedding"], (vision["width"],), state["visual.ln_pre.weight"],
           state["visual.ln_pre.bias"])
    x = _transformer(x, state, "visual.", vision["layers"], vision["width"] // vision["head_width"])
    x = ln(x, (vision["width"],), state["visual.ln_post.weight"], state["visual.ln_post.bias"])
    image = x[:, 0] @ state["visual.proj"]
    length = text["context_length"]
    causal = torch.full((length, length), float("-inf")).triu(1)
    t = state["token_embedding.weight"][tokens] + state["positional_embedding"]
    t = _transformer(t, state, "", text["layers"], text["heads"], causal)
    t = ln(t, (text["width"],), state["ln_final.weight"], state["ln_final.bias"])
    text_features = t[torch.arange(t.shape[0]), tokens.argmax(dim=-1)] @ state["text_projection"]
    image, text_features = (torch.nn.functional.normalize(f, dim=-1) for f in (image, text_features))
    return 100 * (image * text_features).sum(-1)


def open_clip_tokens(tokenizer_folder, prompts: list[str], length: int) -> torch.Tensor:
    """start + words + end, zero-padded to the context length (open_clip's tokenize)."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_folder)
    tokens = torch.zeros(len(prompts), length, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids = tokenizer(prompt)["input_ids"]
        tokens[row, : len(ids)] = torch.tensor(ids)
    return tokens


def test_hps_is_100_times_open_clips_cosine(tiny_hps):
    checkpoint, tokenizer, config = tiny_hps
    forget_all()
    reward = build_reward(RewardSection(name="hps", batch_size=2,
                                        models={"hps": str(checkpoint), "pickscore_processor": str(tokenizer)}))
    images = torch.rand(3, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["a photo of a red clock", "a dog on the bench", "the sign that says hello world"]
    out = guarded_score(reward, images, prompts)
    assert out.valid.all() and not out.strict.any()
    pixels = (images - torch.tensor(OPENAI_CLIP_MEAN).view(1, 3, 1, 1)) / torch.tensor(OPENAI_CLIP_STD).view(1, 3, 1, 1)
    tokens = open_clip_tokens(tokenizer, prompts, config["text_cfg"]["context_length"])
    expected = open_clip_hps(checkpoint, config, pixels, tokens)
    assert expected.std() > 1  # the prompts and images give different scores, so a mix-up would show
    torch.testing.assert_close(out.rewards, expected, atol=1e-4, rtol=1e-4)


def test_a_wrong_or_missing_hps_checkpoint_fails_in_one_line(tiny_hps, tmp_path):
    checkpoint, tokenizer, config = tiny_hps
    forget_all()
    with pytest.raises(RewardError, match=r"reward.models.hps .*does not exist.*HPS_v2.1_compressed.pt"):
        HPSReward.from_files(str(tmp_path / "none.pt"), str(tokenizer))
    other = tmp_path / "other" / "model.pt"
    other.parent.mkdir()
    torch.save({"state_dict": {"fc.weight": torch.zeros(2, 2)}}, other)
    with pytest.raises(RewardError, match=r"does not hold an open_clip CLIP state dict; expected HPS_v2.1") as error:
        HPSReward.from_files(str(other), str(tokenizer))
    assert "\n" not in str(error.value)
    torch.save(torch.load(checkpoint, weights_only=True), other)  # the tiny weights under a wider config
    wider = {**config, "vision_cfg": {**config["vision_cfg"], "width": 48}}
    (other.parent / "open_clip_config.json").write_text(json.dumps(wider))
    with pytest.raises(RewardError, match=r"does not match the open_clip architecture .*size mismatch for vision"):
        HPSReward.from_files(str(other), str(tokenizer))
    with pytest.raises(RewardError, match=r"reward.models.hps_processor .*is not set"):
        HPSReward.from_files(str(checkpoint), None)
