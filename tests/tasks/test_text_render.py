import numpy as np
import torch

from spotlight.tasks.text import MAX_LENGTH
from spotlight.tasks.text_render import HEIGHT, INK, PAPER, WIDTH, render_batch, render_text


def test_each_character_stays_in_its_cell_and_empty_cells_stay_blank() -> None:
    image = render_text("wm8")
    cell = WIDTH // MAX_LENGTH
    ink = image < (INK + PAPER) / 2
    for index in range(MAX_LENGTH):
        columns = ink[:, index * cell : (index + 1) * cell]
        assert columns.any() == (index < 3), index
    assert not ink[:2].any() and not ink[-2:].any()  # vertical margin: nothing clipped


def test_batch_is_grey_rgb_in_model_space_and_deterministic() -> None:
    prompts = ['the word "cat"', 'the number "123456"']
    batch = render_batch(prompts, seed=1)
    assert batch.shape == (2, 3, HEIGHT, WIDTH) and batch.dtype == torch.float32
    assert batch.min() == -1 and batch.max() == 1
    assert torch.equal(batch[:, 0], batch[:, 2])
    assert torch.equal(batch, render_batch(prompts, seed=2))
    expected = torch.from_numpy(render_text("cat").astype(np.float32)) / 127.5 - 1
    assert torch.equal(batch[0, 0], expected)
