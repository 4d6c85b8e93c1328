import hashlib
import json
import logging
import os
import resource
import signal
from pathlib import Path

import pytest
import torch
from random_models import randomised_tinydit

from spotlight.components.checkpoint import (
    MODEL_CONFIG_FILE,
    MODEL_FILE,
    CheckpointError,
    latest_checkpoint,
    load_model,
    load_training_state,
    read_model_metadata,
    save_model,
    save_training_checkpoint,
)
from spotlight.components.manifest import write_manifest
from spotlight.models.tinydit import TinyDiT, TinyDiTConfig

CONFIG = TinyDiTConfig(image_size=8, in_channels=3, patch_size=4, dim=32, depth=1, num_heads=2, vocab_size=16,
                       max_text_len=4)
TOKENS = torch.tensor([[1, 2, 0, 0], [3, 4, 5, 0]])


def randomised_model(seed: int = 0) -> TinyDiT:
    return randomised_tinydit(CONFIG, seed, 0.2)


def fixed_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 8, 8, generator=generator), torch.tensor([0.3, 0.8])


def training_loss(model: TinyDiT) -> torch.Tensor:
    x, sigma = fixed_inputs()
    return (model(x, sigma, TOKENS) - x).pow(2).mean()


def adam_step(model: TinyDiT, optimizer: torch.optim.Optimizer) -> None:
    optimizer.zero_grad()
    training_loss(model).backward()
    optimizer.step()


def test_model_round_trip_gives_identical_outputs(tmp_path: Path) -> None:
    model = randomised_model()
    save_model(tmp_path / "model", model, {"note": "base", "step": 12})
    loaded = load_model(tmp_path / "model")
    assert loaded.config == model.config
    x, sigma = fixed_inputs()
    with torch.no_grad():
        assert torch.equal(loaded(x, sigma, TOKENS), model(x, sigma, TOKENS))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert read_model_metadata(tmp_path / "model") == {"note": "base", "step": 12}


def test_missing_checkpoint_raises_an_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-checkpoint"
    with pytest.raises(CheckpointError, match="no-such-checkpoint") as error:
        load_model(missing)
    assert isinstance(error.value, FileNotFoundError)
    assert str(missing) in str(error.value)


def test_missing_weights_raise_an_error_naming_the_weights_file(tmp_path: Path) -> None:
    save_model(tmp_path / "model", randomised_model())
    (tmp_path / "model" / MODEL_FILE).unlink()
    with pytest.raises(CheckpointError, match=MODEL_FILE) as error:
        load_model(tmp_path / "model")
    assert str(tmp_path / "model" / MODEL_FILE) in str(error.value)


def test_unreadable_checkpoint_raises_a_checkpoint_error(tmp_path: Path) -> None:
    save_model(tmp_path / "model", randomised_model())
    description = json.loads((tmp_path / "model" / MODEL_CONFIG_FILE).read_text())
    description["config"]["dim"] = 64  # weights no longer fit the architecture
    (tmp_path / "model" / MODEL_CONFIG_FILE).write_text(json.dumps(description))
    with pytest.raises(CheckpointError, match="unreadable") as error:
        load_model(tmp_path / "model")
    assert str(tmp_path / "model") in str(error.value)
    (tmp_path / "model" / MODEL_CONFIG_FILE).write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable"):
        load_model(tmp_path / "model")


def test_training_checkpoint_is_complete_and_latest_points_at_it(tmp_path: Path) -> None:
    model = randomised_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    adam_step(model, optimizer)
    ema = randomised_model(5)
    path = save_training_checkpoint(tmp_path, 3, model, optimizer, ema, {"previous": 1.5})
    assert path == tmp_path / "checkpoints" / "iter-000003"
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "iter-000003"
    assert latest_checkpoint(tmp_path) == path
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [MODEL_FILE, MODEL_CONFIG_FILE, "ema.safetensors", "training_state.pt", "state.json", "manifest.json"])
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".staging-")]
    state = load_training_state(path)
    assert state.iteration == 3
    assert state.extra == {"previous": 1.5}
    assert state.ema is not None
    assert all(torch.equal(state.ema[name], tensor) for name, tensor in ema.state_dict().items())
    assert torch.equal(state.rng["torch"], torch.get_rng_state())
    x, sigma = fixed_inputs()
    with torch.no_grad():
        assert torch.equal(load_model(path)(x, sigma, TOKENS), model(x, sigma, TOKENS))
    assert read_model_metadata(path) == {"iteration": 3}


def test_newer_checkpoints_move_the_latest_pointer(tmp_path: Path) -> None:
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert latest_checkpoint(tmp_path) is None
    save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})
    second = save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})
    assert latest_checkpoint(tmp_path) == second
    assert load_training_state(second).ema is None
    again = save_training_checkpoint(tmp_path, 2, model, optimizer, None, {"rewritten": True})
    assert again == second and load_training_state(again).extra == {"rewritten": True}


def test_a_leftover_staging_directory_does_not_affect_latest(tmp_path: Path) -> None:
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})
    torn = tmp_path / "checkpoints" / ".staging-crashed"
    torn.mkdir()
    (torn / MODEL_CONFIG_FILE).write_text("{")  # a crash half-way through writing
    assert latest_checkpoint(tmp_path) == first
    second = save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})
    assert latest_checkpoint(tmp_path) == second


def test_a_crash_while_saving_leaves_the_previous_checkpoint_latest(tmp_path: Path, monkeypatch) -> None:
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the training state")

    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})
    monkeypatch.undo()
    assert latest_checkpoint(tmp_path) == first
    assert not (tmp_path / "checkpoints" / "iter-000002").exists()
    assert load_training_state(first).iteration == 1
    load_model(first)


def test_resuming_the_optimizer_gives_the_same_next_step(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    model = randomised_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        adam_step(model, optimizer)
    path = save_training_checkpoint(tmp_path, 3, model, optimizer, None, {})
    adam_step(model, optimizer)  # the run that was never interrupted

    resumed = load_model(path)
    resumed_optimizer = torch.optim.AdamW(resumed.parameters(), lr=1e-2, weight_decay=0.1)
    resumed_optimizer.load_state_dict(load_training_state(path).optimizer)
    adam_step(resumed, resumed_optimizer)
    for (name, expected), got in zip(model.state_dict().items(), resumed.state_dict().values(), strict=True):
        assert torch.equal(got, expected), name

    fresh = load_model(path)  # without the optimizer state the step differs (the check can fail)
    adam_step(fresh, torch.optim.AdamW(fresh.parameters(), lr=1e-2, weight_decay=0.1))
    assert not torch.equal(fresh.final_linear.weight, model.final_linear.weight)


def test_missing_training_state_raises_naming_the_path(tmp_path: Path) -> None:
    save_model(tmp_path / "only-weights", randomised_model())
    with pytest.raises(CheckpointError, match="training_state.pt") as error:
        load_training_state(tmp_path / "only-weights")
    assert str(tmp_path / "only-weights") in str(error.value)


def test_latest_pointing_at_a_missing_directory_is_no_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("iter-000009\n")
    assert latest_checkpoint(tmp_path) is None


def test_a_crash_while_rewriting_the_latest_iteration_keeps_a_complete_checkpoint(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    # Re-saving an iteration that exists (a resumed run reaching the same iteration again) must not
    # open a window in which the only checkpoint `latest` names has been deleted.
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})
    save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while moving the new checkpoint into place")

    monkeypatch.setattr("os.replace", killed)
    with pytest.raises(KeyboardInterrupt):
        save_training_checkpoint(tmp_path, 2, model, optimizer, None, {"rewritten": True})
    monkeypatch.undo()
    latest = latest_checkpoint(tmp_path)
    assert latest is not None
    assert load_training_state(latest).iteration in (1, 2)
    load_model(latest)


class Payload:
    """Unpickling this runs code: it creates ``marker`` (what a crafted checkpoint would do with a shell)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def test_a_crafted_pickle_in_the_training_state_does_not_run_and_is_one_line(tmp_path: Path) -> None:
    model = randomised_model()
    path = save_training_checkpoint(tmp_path, 1, model, torch.optim.SGD(model.parameters(), lr=0.1), None, {})
    marker = tmp_path / "payload-ran"
    torch.save({"optimizer": Payload(marker), "rng": torch.get_rng_state(), "iteration": 1},
               path / "training_state.pt")
    write_manifest(path)  # the attacker controls the directory, checksums included
    torch.load(path / "training_state.pt", weights_only=False)  # the payload is real: a plain unpickle runs it
    assert marker.is_dir()
    marker.rmdir()
    assert latest_checkpoint(tmp_path) == path
    with pytest.raises(CheckpointError, match="refuses to unpickle") as error:
        load_training_state(path)
    assert not marker.exists()
    assert "\n" not in str(error.value) and "weights_only=False" not in str(error.value)


def test_the_training_state_holds_only_tensors_plain_data_and_json(tmp_path: Path) -> None:
    model = randomised_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    adam_step(model, optimizer)
    extra = {"previous": randomised_model(3).state_dict(), "planner": {"rng": {"state": 2**100 + 7}}, "budget_s": 1.5}
    path = save_training_checkpoint(tmp_path, 4, model, optimizer, None, extra)
    with (path / "training_state.pt").open("rb") as handle:
        torch.load(handle, weights_only=True)  # loads with the restricted unpickler
    assert json.loads((path / "state.json").read_text())["extra"] == {"planner": {"rng": {"state": 2**100 + 7}},
                                                                      "budget_s": 1.5}
    state = load_training_state(path)
    assert state.extra["planner"]["rng"]["state"] == 2**100 + 7
    assert all(torch.equal(state.extra["previous"][k], v) for k, v in extra["previous"].items())
    listed = json.loads((path / "manifest.json").read_text())["files"]
    assert sorted(listed) == sorted(p.name for p in path.iterdir() if p.name != "manifest.json")
    for name, entry in listed.items():  # checksums computed independently of the code under test
        assert entry["sha256"] == hashlib.sha256((path / name).read_bytes()).hexdigest()


def test_an_old_pickled_checkpoint_is_refused_in_one_line(tmp_path: Path) -> None:
    model = randomised_model()
    path = save_training_checkpoint(tmp_path, 2, model, torch.optim.SGD(model.parameters(), lr=0.1), None, {})
    (path / "manifest.json").unlink()
    (path / "state.json").unlink()
    with pytest.raises(CheckpointError, match="earlier Spotlight") as error:
        latest_checkpoint(tmp_path)
    assert "\n" not in str(error.value) and "new run_dir" in str(error.value)
    with pytest.raises(CheckpointError, match="earlier Spotlight"):
        load_training_state(path)


@pytest.mark.parametrize("damaged", ["training_state.pt", MODEL_FILE, "state.json"])
def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, caplog, damaged: str) -> None:
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})
    second = save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})
    os.truncate(second / damaged, (second / damaged).stat().st_size // 2)
    with caplog.at_level(logging.WARNING, logger="spotlight.components.checkpoint"):
        assert latest_checkpoint(tmp_path) == first
    assert "iter-000002" in caplog.text and damaged in caplog.text and "truncated" in caplog.text
    with pytest.raises(CheckpointError, match="truncated"):
        load_training_state(second)


def test_a_flipped_byte_is_caught_by_the_checksum(tmp_path: Path) -> None:
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})
    second = save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})
    data = bytearray((second / MODEL_FILE).read_bytes())
    data[-1] ^= 0xFF
    (second / MODEL_FILE).write_bytes(bytes(data))
    assert latest_checkpoint(tmp_path) == first


def test_no_usable_checkpoint_is_a_one_line_error(tmp_path: Path) -> None:
    model = randomised_model()
    only = save_training_checkpoint(tmp_path, 1, model, torch.optim.SGD(model.parameters(), lr=0.1), None, {})
    (only / "state.json").write_text("{")
    with pytest.raises(CheckpointError, match="no usable checkpoint") as error:
        latest_checkpoint(tmp_path)
    assert "\n" not in str(error.value)


def test_a_failed_write_is_one_line_and_leaves_no_staging_directory(tmp_path: Path) -> None:
    # A real write failure: the kernel refuses writes past RLIMIT_FSIZE (EFBIG), as a full disk refuses them.
    model = randomised_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = save_training_checkpoint(tmp_path, 1, model, optimizer, None, {})
    previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, hard))
    try:
        with pytest.raises(CheckpointError, match="could not write checkpoint") as error:
            save_training_checkpoint(tmp_path, 2, model, optimizer, None, {})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous_handler)
    assert "\n" not in str(error.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["iter-000001", "latest"]
    assert latest_checkpoint(tmp_path) == first


def test_a_truncated_model_file_is_a_checkpoint_error_with_the_fix(tmp_path: Path) -> None:
    save_model(tmp_path / "model", randomised_model())
    os.truncate(tmp_path / "model" / MODEL_FILE, 100)
    with pytest.raises(CheckpointError, match="unreadable.*copy it again") as error:
        load_model(tmp_path / "model")
    assert "\n" not in str(error.value)
