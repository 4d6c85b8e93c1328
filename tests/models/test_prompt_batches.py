"""Prompts encoded in batches equal the same prompts encoded one at a time, row for row (issue 42 item 2).

On an accelerator `PromptCache` encodes a call's new prompts ``ENCODE_BATCH`` at a time. SD3 and FLUX pad
every prompt to ``max_sequence_length``; Qwen-Image's pipeline pads a batch to its longest prompt, and
each cached row must be cut back to the prompt's own length. A batched row may differ from the prompt
encoded alone only by the rounding of a matrix product of several rows (CLIP's pooled projection
shows it on the CPU), never in shape or by a padded position.
"""

from __future__ import annotations

import pytest
import torch

from spotlight.models.pipelines.folder import read_pipeline_folder
from spotlight.models.pipelines.prompts import PromptCache, prompt_id

PROMPTS = ["a red circle", "two blue squares left of a green triangle", "a cat", "an old map of a harbour town",
           "seven yellow stars"]


@pytest.mark.parametrize("family", ["sd3", "flux", "qwen-image"])
def test_a_batched_row_is_the_prompt_encoded_alone(family: str, tiny_pipeline) -> None:
    folder = read_pipeline_folder(tiny_pipeline(family))
    length = 512 if family == "qwen-image" else 64  # no prompt truncated (Qwen-Image's count its chat template)
    alone = PromptCache(folder, torch.float32, max_sequence_length=length)  # the CPU's default: one prompt a call
    batched = PromptCache(folder, torch.float32, max_sequence_length=length, encode_batch=4)  # 4 + 1: two calls
    alone.ids(PROMPTS)
    batched.ids(PROMPTS)
    lengths = set()
    for prompt in PROMPTS:
        one, many = alone.row(prompt_id(prompt)), batched.row(prompt_id(prompt))
        assert one.embeds.shape == many.embeds.shape  # Qwen-Image: cut to the prompt's length, not the batch's
        torch.testing.assert_close(many.embeds, one.embeds, rtol=1e-5, atol=1e-5)
        if one.pooled is not None:
            torch.testing.assert_close(many.pooled, one.pooled, rtol=1e-5, atol=1e-5)
        assert many.embeds.untyped_storage().nbytes() == many.embeds.nbytes  # its own storage, not the batch's
        lengths.add(one.embeds.shape[1])
    if family == "qwen-image":
        assert len(lengths) > 1  # the prompts' lengths differ, so the batches were padded


def test_export_hands_rows_over_on_the_cpu_and_adopt_keeps_the_cache_on_its_device(tiny_pipeline) -> None:
    folder = read_pipeline_folder(tiny_pipeline("sd3"))
    source, target = PromptCache(folder, torch.float32, 32), PromptCache(folder, torch.float32, 32)
    rows = source.export(PROMPTS[:2])
    assert all(row.embeds.device.type == "cpu" for _, row in rows.values())
    target.adopt(rows)
    assert target._pipe is None  # adopted rows need no encoder here
    for prompt in PROMPTS[:2]:
        assert torch.equal(target.row(prompt_id(prompt)).embeds, source.row(prompt_id(prompt)).embeds)
