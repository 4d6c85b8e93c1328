"""The base of every config section (typed, frozen, unknown fields refused), the config error type, and reading
a YAML file with ``-s`` overrides into a section as one-line errors.

Kept apart from ``spotlight.config`` so that any module (the planner, the simulator, a model adapter)
can define its own section without importing the whole run configuration.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """A config that cannot run; the message is one line naming the field and the fix."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _format_validation_error(error: ValidationError, source: str, overrides: dict[str, str] | None = None) -> str:
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    given = [override for key, override in (overrides or {}).items()  # the -s that set the field (or its section)
             if f"{field}.".startswith(f"{key}.") or f"{key}.".startswith(f"{field}.")]
    detail = first["msg"]
    got = "" if first["type"] == "value_error" else f" (got {first.get('input')!r})"
    if first["type"] == "extra_forbidden":
        detail = "unknown field (check the spelling; see configs/ for every field)"
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{f'-s {given[-1]}' if given else source}: {field}: {detail}{got}{more}"


def parse_config(model: type[Section], data: dict[str, Any], source: str = "config",
                 overrides: dict[str, str] | None = None) -> Any:
    """Validate ``data`` into ``model``, raising a one-line :class:`ConfigError` (naming the ``-s`` at fault)."""
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error, source, overrides)) from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error.

    Plain YAML lets the last one win silently, so a config that sets ``learning_rate`` twice runs
    with whichever came last and the reader of the file believes the other.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # '<<' merges may be overridden on purpose
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key: the base loader reports it
                continue
            if seen is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first on line {seen}): keep one of them", key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _yaml_problem(error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}: " if mark is not None else ""
    return f"{where}{' '.join(str(getattr(error, 'problem', None) or error).split())}"


def _read_config_file(path: Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; every way it can be unreadable is a one-line ConfigError."""
    if path.is_dir():
        raise ConfigError(f"config file {path} is a directory: pass a YAML file (see configs/)")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist: pass an existing YAML file (see configs/)")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {error.start}): save it as UTF-8") from None
    except OSError as error:
        raise ConfigError(f"config file {path} cannot be read ({error.strerror}): fix its permissions") from None
    try:
        loaded = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML ({_yaml_problem(error)})") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(loaded).__name__}")
    return loaded or {}


def load_config(model: type[Section], path: str | Path | None, overrides: list[str] | None = None) -> Any:
    """Load a YAML config (or the defaults when ``path`` is None) and apply ``key.sub=value`` overrides."""
    data: dict[str, Any] = {}
    source = "-s" if overrides else "defaults"  # the defaults alone are valid: without a file, -s is at fault
    if path is not None:
        path = Path(path)
        source = str(path)
        data = _read_config_file(path)
    for override in overrides or []:
        key, sep, raw = override.partition("=")
        if not sep or not key or "" in key.split("."):
            raise ConfigError(f"override {override!r} must look like section.field=value")
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {override!r}: {part} is not a section")
        try:
            node[parts[-1]] = yaml.load(raw, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
        except yaml.YAMLError as error:
            raise ConfigError(f"override {override!r}: the value is not valid YAML ({_yaml_problem(error)}): quote "
                              f"it, e.g. -s '{key}=\"...\"'") from None
    return parse_config(model, data, source, {override.partition("=")[0]: override for override in overrides or []})


def dump_config(config: Section, path: Path) -> None:
    """Write the resolved config as YAML (the run directory's record of what ran)."""
    path.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
