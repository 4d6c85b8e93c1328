import pytest
import torch

from spotlight.config import TrainConfig
from spotlight.models.generation import prompt_tokens
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig, sincos_2d
from spotlight.task_presets import TASKS, get_task, task_of
from spotlight.tasks import text
from spotlight.trainer import RunError, Trainer


def ocr_model() -> TinyDiT:
    task = get_task("ocr")
    height, width = task.image_size
    return TinyDiT(TinyDiTConfig(image_size=height, image_width=width, patch_size=8, dim=32, depth=1, num_heads=2,
                                 vocab_size=task.vocab_size, max_text_len=8, task="ocr"))


def test_a_non_square_tinydit_maps_32x128_latents_to_velocities_of_the_same_shape() -> None:
    model = ocr_model()
    assert model.config.latent_shape == (3, 32, 128) and model.config.num_image_tokens == 4 * 16
    x = torch.randn(2, 3, 32, 128)
    tokens = prompt_tokens(model, ['the word "cat"', 'the number "1234"'])
    assert model(x, torch.tensor([0.5, 0.9]), tokens).shape == x.shape


def test_square_position_embedding_is_unchanged_by_the_width_argument() -> None:
    assert torch.equal(sincos_2d(4, 32), sincos_2d(4, 32, 4))


def test_the_model_records_its_task_and_its_tokenizer_follows() -> None:
    model = ocr_model()
    assert task_of(model) is TASKS["ocr"]
    assert torch.equal(prompt_tokens(model, ['the word "cab"']), text.tokenize(['the word "cab"'], 8))
    assert task_of(TinyDiT(TinyDiTConfig(dim=32, depth=1, num_heads=2))) is TASKS["shapes"]


def test_each_task_renders_its_prompts_at_its_image_size() -> None:
    for task in TASKS.values():
        prompts = task.split()[1][:2]
        height, width = task.image_size
        assert task.render_batch(prompts, 0, height, width, None).shape == (2, 3, height, width)
        assert task.tokenize(prompts, 12).shape == (2, 12)


def test_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="shapes"):
        get_task("faces")


def test_training_refuses_a_base_model_of_another_task(tiny_base_model, tmp_path) -> None:
    config = TrainConfig(task="ocr", mode="vanilla", base_checkpoint=str(tiny_base_model), run_dir=str(tmp_path))
    with pytest.raises(RunError, match="'shapes' model"):
        Trainer(config)


def test_the_shipped_ocr_base_model_is_an_ocr_model_of_32x128_lines() -> None:
    from spotlight.components.checkpoint import load_model

    model = load_model("ocr-base")
    assert task_of(model) is TASKS["ocr"] and model.config.latent_shape == (3, 32, 128)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_each_task_is_a_preset_of_a_dataset_a_reward_and_a_shipped_base_model(name: str) -> None:
    from spotlight.components.checkpoint import load_model

    task = get_task(name)
    dataset = task.dataset()
    assert dataset.train and dataset.test and not set(dataset.train) & set(dataset.test)
    assert task.make_reward(0.5).name
    assert task_of(load_model(task.base_model)) is task  # the base model was trained with this task's tokenizer
