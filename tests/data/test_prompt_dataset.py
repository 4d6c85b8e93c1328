import json
from pathlib import Path

import pytest

from spotlight.config import TrainConfig, load_config
from spotlight.data import DatasetError, load_prompt_folder, open_dataset
from spotlight.task_presets import get_task


def write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_records(path: Path, records: list[dict]) -> None:
    write_lines(path, [json.dumps(record) for record in records])


def test_text_folder_gives_one_prompt_a_line_in_order(tmp_path: Path) -> None:
    write_lines(tmp_path / "train.txt", ["  a sign that reads \"OPEN\" ", "", "a mug with \"Hi\"", "a mug with \"Hi\""])
    write_lines(tmp_path / "test.txt", ["a poster reading \"Sale\""])
    dataset = load_prompt_folder(tmp_path)
    assert dataset.train == ["a sign that reads \"OPEN\"", "a mug with \"Hi\"", "a mug with \"Hi\""]
    assert dataset.test == ["a poster reading \"Sale\""]
    assert not dataset.has_metadata
    assert dataset.metadata_for(dataset.train) is None
    assert dataset.kind_of(dataset.test[0]) is None


def test_metadata_folder_gives_each_prompt_its_record_and_tag(tmp_path: Path) -> None:
    dog = {"tag": "counting", "include": [{"class": "dog", "count": 2}], "prompt": "a photo of two dogs"}
    cat = {"tag": "single_object", "include": [{"class": "cat", "count": 1}], "prompt": "a photo of a cat"}
    write_records(tmp_path / "train_metadata.jsonl", [dog, cat])
    write_records(tmp_path / "test_metadata.jsonl", [cat, cat])
    dataset = load_prompt_folder(tmp_path)
    assert dataset.train == [dog["prompt"], cat["prompt"]]
    assert dataset.test == [cat["prompt"], cat["prompt"]]  # repeats kept (GenEval: 4 images per prompt)
    assert dataset.metadata_for([cat["prompt"], dog["prompt"]]) == [cat, dog]
    assert dataset.kind_of(dog["prompt"]) == "counting"
    with pytest.raises(KeyError, match="a photo of a horse"):
        dataset.metadata_for(["a photo of a horse"])


@pytest.mark.parametrize(("files", "message"), [
    ({}, "holds neither split: it needs train.txt and test.txt, or train_metadata.jsonl"),
    ({"train.txt": "a\n"}, "holds train.txt: it needs"),
    ({"train.txt": "a\n", "test_metadata.jsonl": '{"prompt": "b"}\n'}, "holds test_metadata.jsonl, train.txt"),
    ({"train.txt": "a\n", "test.txt": "\n  \n"}, "test.txt has no prompts: the test split needs at least one"),
    ({"train_metadata.jsonl": "{bad\n", "test_metadata.jsonl": '{"prompt": "b"}\n'}, "line 1 is not JSON"),
    ({"train_metadata.jsonl": '{"tag": "x"}\n', "test_metadata.jsonl": '{"prompt": "b"}\n'},
     'line 1 has no "prompt" string'),
    ({"train_metadata.jsonl": '{"prompt": "b", "tag": "x"}\n', "test_metadata.jsonl": '{"prompt": "b", "tag": "y"}\n'},
     "appears with two different records"),
])
def test_unusable_folder_is_one_line_naming_the_cause(tmp_path: Path, files: dict[str, str], message: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    with pytest.raises(DatasetError, match=message.replace("(", r"\(").replace(")", r"\)")) as caught:
        load_prompt_folder(tmp_path)
    assert "\n" not in str(caught.value)


def test_missing_folder_and_file_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist: point it at a folder holding train.txt"):
        open_dataset(str(tmp_path / "nowhere"))
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetError, match="is a file, not a folder"):
        open_dataset(str(tmp_path / "file"))
    with pytest.raises(DatasetError, match="name a shipped set"):
        open_dataset("no-such-shipped-set")


def test_shipped_sets_load_by_name_with_disjoint_splits_and_their_licence() -> None:
    ocr, geneval = open_dataset("ocr"), open_dataset("geneval")
    assert (len(ocr.train), len(ocr.test)) == (815, 203)
    assert (len(geneval.train), len(geneval.test)) == (443, 110)  # each of GenEval's prompts once
    for dataset in (ocr, geneval):
        assert not set(dataset.train) & set(dataset.test)
        assert (Path(dataset.name) / "LICENSE").read_text().startswith("MIT License")
    assert all('"' in prompt for prompt in ocr.train[:50])  # OCR prompts quote the text to render
    record = geneval.metadata_for(geneval.test[:1])[0]
    assert record["prompt"] == geneval.test[0] and record["tag"] in {
        "single_object", "two_object", "counting", "colors", "position", "color_attr"}
    assert {geneval.kind_of(prompt) for prompt in geneval.train} == {
        "single_object", "two_object", "counting", "colors", "position", "color_attr"}


def test_a_folder_in_the_working_directory_wins_over_a_shipped_set(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "ocr").mkdir()
    write_lines(tmp_path / "ocr" / "train.txt", ["mine"])
    write_lines(tmp_path / "ocr" / "test.txt", ["mine too"])
    monkeypatch.chdir(tmp_path)
    assert open_dataset("ocr").train == ["mine"]


def test_task_preset_dataset_is_the_tasks_split_with_its_kinds() -> None:
    task = get_task("shapes")
    dataset = task.dataset()
    assert (dataset.train, dataset.test) == tuple(list(split) for split in task.split())
    assert all(dataset.kind_of(prompt) == task.kind_of(prompt) for prompt in dataset.test)
    assert dataset.metadata_for(dataset.test) is None


def test_data_section_takes_a_dataset_and_refuses_unknown_fields() -> None:
    assert load_config(TrainConfig, None, ["data.dataset=/data/ocr"]).data.dataset == "/data/ocr"
    assert load_config(TrainConfig, None, []).data.dataset is None
    with pytest.raises(ValueError, match="data.datset: unknown field"):
        load_config(TrainConfig, None, ["data.datset=ocr"])


def test_train_kinds_keeps_the_hard_prompts_for_training_and_names_the_kinds_when_one_is_unknown() -> None:
    dataset = get_task("shapes").dataset()
    hard = dataset.train_of_kinds(["counting", "position"])
    assert hard and len(hard) < len(dataset.train)
    assert {dataset.kind_of(prompt) for prompt in hard} == {"counting", "position"}
    with pytest.raises(ValueError, match=r"names \['colour'\].*its kinds: \['counting', 'position', 'single', "
                                         r"'two_object'\]"):
        dataset.train_of_kinds(["counting", "colour"])
