from pathlib import Path

import pytest

from spotlight.config import (
    ConfigError,
    PretrainConfig,
    TrainConfig,
    dump_config,
    load_config,
    parse_config,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def config_error(*args, **kwargs) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(*args, **kwargs)
    message = str(error.value)
    assert "\n" not in message  # errors are one line
    return message


def test_defaults_load_and_match_the_documented_values() -> None:
    config = load_config(TrainConfig, None)
    assert config == TrainConfig()
    assert config.mode == "spotlight"
    documented = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
    assert load_config(TrainConfig, documented) == config  # configs/default.yaml lists every default
    assert config.train.clip_range == 1e-4
    assert config.rollout.group_size == 8
    assert config.rollout.noise_level == 0.7
    assert load_config(PretrainConfig, None) == PretrainConfig()


def test_a_yaml_file_sets_fields_and_keeps_other_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 3\nmode: sync-explore\ntrain:\n  learning_rate: 0.0005\n  kl_beta: 0.04\n")
    config = load_config(TrainConfig, path)
    assert (config.seed, config.mode) == (3, "sync-explore")
    assert config.train.learning_rate == 0.0005
    assert config.train.kl_beta == 0.04
    assert config.train.clip_range == 1e-4
    assert config.rollout == TrainConfig().rollout


def test_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    assert load_config(TrainConfig, write(tmp_path, "")) == TrainConfig()


def test_a_misspelt_field_is_named_in_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  learning_rte: 0.0002\n")
    message = config_error(TrainConfig, path)
    assert "train.learning_rte" in message
    assert "unknown field" in message
    assert str(path) in message


def test_a_wrong_type_names_the_field_and_the_value(tmp_path: Path) -> None:
    message = config_error(TrainConfig, write(tmp_path, "rollout:\n  group_size: many\n"))
    assert "rollout.group_size" in message
    assert "'many'" in message


def test_an_out_of_range_value_names_the_field(tmp_path: Path) -> None:
    message = config_error(TrainConfig, write(tmp_path, "rollout:\n  group_size: 1\n"))
    assert "rollout.group_size" in message
    message = config_error(TrainConfig, write(tmp_path, "train:\n  timestep_fraction: 1.5\n"))
    assert "train.timestep_fraction" in message
    message = config_error(TrainConfig, write(tmp_path, "mode: fast\n"))
    assert "mode" in message and "'fast'" in message


def test_several_errors_report_the_first_and_count_the_rest(tmp_path: Path) -> None:
    message = config_error(TrainConfig, write(tmp_path, "iterations: 0\ntrain:\n  clip_range: -1\n  typo: 1\n"))
    assert "(+2 more)" in message


def test_a_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "run.yaml"
    message = config_error(TrainConfig, missing)
    assert str(missing) in message


@pytest.mark.parametrize(
    "text",
    [
        "seed: 0\nrollout:\n  group_size: 8\n bad_indent: 3\n",  # line 4 breaks the indentation
        "seed: 0\ntrain:\n  clip_range: 0.2\n\tkl_beta: 0.1\n",  # a tab on line 4
    ],
)
def test_invalid_yaml_gives_one_line_with_the_line_number(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    message = config_error(TrainConfig, path)
    assert "line 4" in message
    assert str(path) in message
    assert "YAML" in message


def test_a_top_level_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    message = config_error(TrainConfig, write(tmp_path, "- seed\n- mode\n"))
    assert "mapping" in message


def test_overrides_set_nested_fields() -> None:
    config = load_config(TrainConfig, None, ["train.learning_rate=2e-4", "rollout.group_size=4", "seed=9",
                                              "mode=stale-explore", "train.ema_decay=0.9"])
    assert config.train.learning_rate == 2e-4
    assert isinstance(config.train.learning_rate, float)
    assert config.rollout.group_size == 4
    assert config.seed == 9
    assert config.mode == "stale-explore"
    assert config.train.ema_decay == 0.9


def test_overrides_win_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "train:\n  learning_rate: 0.001\n  kl_beta: 0.1\n")
    config = load_config(TrainConfig, path, ["train.learning_rate=2e-4"])
    assert config.train.learning_rate == 2e-4
    assert config.train.kl_beta == 0.1


@pytest.mark.parametrize(
    "override,named",
    [("train.learning_rate", "section.field=value"), ("=3", "section.field=value"),
     ("seed.value=1", "seed is not a section"), ("train.lerning_rate=1", "train.lerning_rate")],
)
def test_bad_overrides_name_the_problem(override: str, named: str, tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 1\n")
    assert named in config_error(TrainConfig, path, [override])


def test_exploration_needs_at_least_group_size_candidates() -> None:
    overrides = ["mode=sync-explore", "explore.num_candidates=4", "rollout.group_size=8"]
    message = config_error(TrainConfig, None, overrides)
    assert "explore.num_candidates" in message
    assert "rollout.group_size" in message
    assert "4 < 8" in message
    # vanilla does not explore, and equal counts are enough
    assert load_config(TrainConfig, None, ["mode=vanilla", "explore.num_candidates=4",
                                           "rollout.group_size=8"]).mode == "vanilla"
    load_config(TrainConfig, None, ["mode=stale-explore", "explore.num_candidates=8", "rollout.group_size=8"])


def test_sp_groups_serve_exploration_on_the_local_ray_cluster_only() -> None:
    assert load_config(TrainConfig, None, []).runtime.sp_degree == 1
    shipped = load_config(TrainConfig, Path(__file__).parents[1] / "configs" / "spotlight-sp2.yaml")
    assert (shipped.mode, shipped.runtime.sp_degree) == ("spotlight", 2)
    assert load_config(TrainConfig, None, ["mode=sync-explore", "runtime.use_ray=true",
                                           "runtime.sp_degree=2"]).runtime.sp_degree == 2
    for overrides, named in [(["mode=spot-rollout"], "spot-rollout"), (["mode=stale-explore"], "without Ray"),
                             (["runtime.address=auto"], "local cluster")]:
        message = config_error(TrainConfig, None, ["runtime.sp_degree=2", *overrides])
        assert "runtime.sp_degree=2" in message and named in message
    assert "runtime.sp_degree" in config_error(TrainConfig, None, ["runtime.sp_degree=0"])


def test_parse_config_names_its_source() -> None:
    with pytest.raises(ConfigError, match=r"^cli: rollout\.num_steps"):
        parse_config(TrainConfig, {"rollout": {"num_steps": 0}}, source="cli")


def test_dumped_config_loads_back_equal(tmp_path: Path) -> None:
    config = load_config(TrainConfig, None, ["mode=sync-explore", "train.ema_decay=0.99", "train.kl_beta=0.04"])
    dump_config(config, tmp_path / "resolved.yaml")
    assert load_config(TrainConfig, tmp_path / "resolved.yaml") == config
    pretrain = PretrainConfig()
    dump_config(pretrain, tmp_path / "pretrain.yaml")
    assert load_config(PretrainConfig, tmp_path / "pretrain.yaml") == pretrain


def test_configs_are_frozen() -> None:
    config = TrainConfig()
    with pytest.raises(ValueError):
        config.train.learning_rate = 1.0  # type: ignore[misc]


def test_a_key_given_twice_is_refused_naming_the_key_and_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "seed: 0\ntrain:\n  learning_rate: 0.001\n  kl_beta: 0.1\n  learning_rate: 0.01\n")
    message = config_error(TrainConfig, path)
    assert "duplicate key 'learning_rate'" in message and "line 5" in message and "line 3" in message
    assert "duplicate key 'seed'" in config_error(TrainConfig, write(tmp_path, "seed: 0\nseed: 1\n"))


def test_a_yaml_error_inside_an_override_is_one_line_with_the_fix(tmp_path: Path) -> None:
    message = config_error(TrainConfig, None, ["train.learning_rate=[1,"])
    assert "override 'train.learning_rate=[1,'" in message and "quote it" in message
    assert "duplicate key 'a'" in config_error(TrainConfig, None, ["runtime.planner={a: 1, a: 2}"])


def test_a_directory_given_as_the_config_file_is_named_as_one(tmp_path: Path) -> None:
    assert "is a directory" in config_error(TrainConfig, tmp_path)


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("seed: 1  # r\xe9glage\n".encode("latin-1"))
    message = config_error(TrainConfig, path)
    assert "not UTF-8" in message and "save it as UTF-8" in message


def test_a_run_dir_that_is_a_file_is_refused_at_load(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    message = config_error(TrainConfig, None, [f"run_dir={tmp_path / 'taken'}"])
    assert "run_dir" in message and "is a file" in message
