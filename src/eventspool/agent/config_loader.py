"""Generic loading of declared settings: TOML in, typed and checked values out.

A `Setting` declares one key (its kind, default, bounds and meaning) and a `Section`
declares a `[table]` of them; `SettingsLoader` reads any such declaration, so a new key
needs a line in a table, not code. It remembers where each value came from (the file or
an `EVENTSPOOL_*` variable), so that every error names the key, the bad value and what
is allowed: the operator who reads it has the file open, not the source.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from eventspool.config import validate_topic
from eventspool.errors import EventspoolError, InvalidEventError

ENV_PREFIX = "EVENTSPOOL_"


class ConfigError(EventspoolError):
    """The configuration cannot be used; the message names the key, the value and the rule.

    `key` is the dotted key ("spool.durability") when one key is at fault, so that tools
    can point at it without parsing the message.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


# What a key holds in TOML, and so how it is checked and parsed from the environment:
# "choice" is a string among `choices`, "path" a string made absolute, "mode" an octal
# permission mode, "patterns" a list of name globs, "ids" a list of numeric ids, "names"
# a list of non-empty strings, "name" one non-empty string.
Kind = Literal[
    "int", "float", "bool", "str", "choice", "path", "mode", "patterns", "ids", "names", "name"
]
# A bound on a typed value: what is wrong with it, or None.
Check = Callable[[Any], str | None]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Setting:
    """One key of a table: its kind, default (None: not set), bounds and meaning."""

    name: str
    kind: Kind
    doc: str
    default: object = None
    checks: tuple[Check, ...] = ()
    choices: tuple[str, ...] = ()
    # The settings object's field, where its name differs from the key's.
    field: str = ""
    # 0 turns a limit off: the settings object is given None.
    zero_is_off: bool = False

    @property
    def target(self) -> str:
        return self.field or self.name


@dataclass(frozen=True, slots=True)
class Section:
    """A `[section]` of scalar settings, which the environment may override, and the
    names of its sub-tables, which have readers of their own."""

    name: str
    settings: tuple[Setting, ...]
    tables: tuple[str, ...] = ()

    def names(self) -> tuple[str, ...]:
        return tuple(setting.name for setting in self.settings)


def positive(value: float) -> str | None:
    return "must be positive" if value < 1 else None


def positive_finite(value: float) -> str | None:
    return "must be positive and finite" if value <= 0 or math.isinf(value) else None


def at_most(limit: int) -> Check:
    def check(value: int) -> str | None:
        return f"must be at most {limit}" if value > limit else None

    return check


def default_of(model: type[Any], name: str) -> object:
    """A settings dataclass's default for `name`: the model owns it, the table shows it."""
    for model_field in dataclasses.fields(model):
        if model_field.name == name and model_field.default is not dataclasses.MISSING:
            return model_field.default
    raise AttributeError(f"{model.__name__} has no default for {name}")


def env_name(section: str, key: str) -> str:
    return ENV_PREFIX + f"{section}_{key}".upper().replace(".", "_").replace("-", "_")


def env_variables(sections: Iterable[Section]) -> dict[str, tuple[str, str]]:
    """Variable name -> (section, key), for every scalar setting."""
    return {
        env_name(section.name, setting.name): (section.name, setting.name)
        for section in sections
        for setting in section.settings
    }


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def read_toml(path: Path) -> dict[str, Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the configuration: {exc.strerror or exc}") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # "file:line:column: problem", the form editors and terminals jump to.
        match = re.fullmatch(r"(.*) \(at line (\d+), column (\d+)\)", str(exc), re.DOTALL)
        if match:
            problem, line, column = match.groups()
            raise ConfigError(f"{path}:{line}:{column}: invalid TOML: {problem}") from exc
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def dotted(*parts: str) -> str:
    """Join key parts as TOML would write them, quoting the ones that are not bare keys."""
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p) for p in parts)


def show(value: object) -> str:
    """Render a value the way it is written in TOML, which is what the reader has in front."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def toml_type(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return "a date or time"


def close_match(name: str, options: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


def one_of(choices: Iterable[str]) -> str:
    return ", ".join(json.dumps(choice) for choice in choices)


class SettingsLoader:
    """Reads declared sections; holds where each value came from, so that errors can
    name the file or the variable."""

    def __init__(
        self,
        file: Path | None,
        sections: Iterable[Section],
        *,
        named_tables: tuple[str, ...],
        arrays: tuple[str, ...],
    ) -> None:
        self.file = file
        self.base = file.absolute().parent if file is not None else Path.cwd()
        self.sections = {section.name: section for section in sections}
        # Sections of named tables ([topics.NAME]) and arrays of tables ([[access]]),
        # whose entries are read by their own code.
        self.named_tables = named_tables
        self.arrays = arrays
        self.from_env: dict[str, str] = {}  # dotted key -> environment variable
        self.env_vars = env_variables(self.sections.values())
        # Variables under these prefixes are ours: an unknown one is a typo, not someone else's.
        self.env_prefixes = tuple(f"{ENV_PREFIX}{name.upper()}_" for name in self.sections)

    # -- messages -------------------------------------------------------------------

    def where(self, key: str) -> str:
        variable = self.from_env.get(key)
        if variable is not None:
            return f"{variable} ({key})"
        return f"{self.file}: {key}" if self.file is not None else key

    def error(self, key: str, value: object, problem: str) -> ConfigError:
        return ConfigError(f"{self.where(key)} = {show(value)}: {problem}", key=key)

    def unknown(
        self, key: str, what: str, siblings: Iterable[str], hint: str | None
    ) -> ConfigError:
        """Name the unknown key, and the likely intended one, or else the known ones."""
        prefix = f"{self.file}: " if self.file is not None else ""
        siblings = sorted(siblings)
        if hint is not None:
            advice = f"; did you mean {hint}?"
        else:
            advice = f" (known: {', '.join(siblings)})" if siblings else ""
        return ConfigError(f"{prefix}unknown {what} {key}{advice}", key=key)

    def check_keys(
        self, prefix: str, body: Mapping[str, Any], known: Iterable[str], *, suggest: bool = True
    ) -> None:
        """Every key of the table at `prefix` is one of `known`; else the error names the
        close one (with `suggest`) or all of them."""
        known = tuple(known)
        for key in body:
            if key not in known:
                close = close_match(key, known) if suggest else None
                raise self.unknown(
                    f"{prefix}.{dotted(key)}", "key", known, close and f"{prefix}.{dotted(close)}"
                )

    # -- structure ------------------------------------------------------------------

    def structure(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Reject unknown sections and keys before any value is looked at."""
        tables = (*self.sections, *self.named_tables)
        out: dict[str, Any] = {name: [] for name in self.arrays}
        for name, body in raw.items():
            if name in self.arrays:
                if not isinstance(body, list) or not all(isinstance(item, dict) for item in body):
                    raise self.error(name, body, f"expected [[{name}]] tables")
                out[name] = list(body)
                continue
            if name not in tables:
                if not isinstance(body, dict):
                    # A key above every section: probably a forgotten [section] header.
                    homes = [dotted(s, name) for s in self.sections if name in self._known(s)]
                    raise self.unknown(dotted(name), "top-level key", (), next(iter(homes), None))
                close = close_match(name, tables)
                raise self.unknown(
                    f"[{name}]", "section", (f"[{s}]" for s in tables), close and f"[{close}]"
                )
            if not isinstance(body, dict):
                raise self.error(name, body, f"expected a table ([{name}]), got {toml_type(body)}")
            out[name] = dict(body)
        for name in self.named_tables:
            out.setdefault(name, {})
        for section in self.sections.values():
            body = out.setdefault(section.name, {})
            for key, value in body.items():
                if key in section.names():
                    continue
                key_name = dotted(section.name, key)
                if key not in section.tables:
                    known = (*section.names(), *section.tables)
                    raise self.unknown(key_name, "key", known, self._hint(section.name, key))
                if not isinstance(value, dict):
                    raise self.error(key_name, value, f"expected a table, got {toml_type(value)}")
        return out

    def _known(self, section: str) -> tuple[str, ...]:
        return self.sections[section].names()

    def _hint(self, section: str, key: str) -> str | None:
        close = close_match(key, (*self._known(section), *self.sections[section].tables))
        if close is not None:
            return dotted(section, close)
        homes = [dotted(s, key) for s in self.sections if key in self._known(s) and s != section]
        return homes[0] if homes else None

    def topic_name(self, key: str, topic: str) -> None:
        try:
            validate_topic(topic)
        except InvalidEventError as exc:
            raise ConfigError(f"{self.where(key)}: {exc}", key=key) from exc

    # -- environment ----------------------------------------------------------------

    def apply_env(self, sections: dict[str, Any], env: Mapping[str, str]) -> None:
        """Override scalar keys; an empty variable means "not set" (back to the default)."""
        for variable in sorted(env):
            target = self.env_vars.get(variable)
            if target is None:
                if variable.startswith(self.env_prefixes):
                    raise ConfigError(
                        f"unknown environment variable {variable}"
                        + (
                            f"; did you mean {close}?"
                            if (close := close_match(variable, self.env_vars))
                            else ""
                        )
                    )
                continue
            section, key = target
            key_name = dotted(section, key)
            self.from_env[key_name] = variable
            text = env[variable]
            if text == "":
                sections[section].pop(key, None)
                del self.from_env[key_name]
                continue
            setting = next(s for s in self.sections[section].settings if s.name == key)
            sections[section][key] = self._parse_env(variable, key_name, text, setting.kind)

    def _parse_env(self, variable: str, key: str, text: str, kind: Kind) -> object:
        def fail(expected: str) -> ConfigError:
            return ConfigError(
                f"{variable} = {json.dumps(text)}: expected {expected} for {key}", key=key
            )

        stripped = text.strip()
        if kind == "int":
            try:
                return int(stripped, 10)
            except ValueError:
                raise fail("an integer") from None
        if kind == "float":
            try:
                return float(stripped)
            except ValueError:
                raise fail("a number") from None
        if kind == "bool":
            lowered = stripped.lower()
            if lowered in _TRUE:
                return True
            if lowered in _FALSE:
                return False
            raise fail("true/false, 1/0 or yes/no")
        if kind == "patterns":  # comma-separated
            return [item.strip() for item in text.split(",") if item.strip()]
        return text  # strings, paths, and socket modes, which are parsed like the file's strings

    # -- values ---------------------------------------------------------------------

    def values(
        self,
        prefix: str,
        body: Mapping[str, Any],
        settings: Iterable[Setting],
        *,
        defaults: bool = False,
    ) -> dict[str, Any]:
        """The keys present in `body`, each typed, parsed and checked against its bounds;
        with `defaults`, the declared default of each key that is absent."""
        out: dict[str, Any] = {}
        for setting in settings:
            key = f"{prefix}.{setting.name}"
            if setting.name in body:
                value = self._parse(key, setting, self._typed(key, setting, body[setting.name]))
                for check in setting.checks:
                    problem = check(value)
                    if problem is not None:
                        raise self.error(key, value, problem)
                out[setting.name] = value
            elif defaults and setting.default is not None:
                out[setting.name] = self._parse(key, setting, setting.default)
        return out

    def _typed(self, key: str, setting: Setting, value: object) -> Any:
        """`value` if it is of the setting's kind (ints pass as floats), else the error."""
        kind = setting.kind
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(key, value, f"expected an integer, got {toml_type(value)}")
        elif kind == "float":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.error(key, value, f"expected a number, got {toml_type(value)}")
            if math.isnan(value):
                raise self.error(key, value, "expected a number, got nan")
            return float(value)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise self.error(key, value, f"expected true or false, got {toml_type(value)}")
        elif kind in ("str", "choice", "path"):
            if not isinstance(value, str):
                raise self.error(key, value, f"expected a string, got {toml_type(value)}")
            if kind == "choice" and value not in setting.choices:
                raise self.error(key, value, f"must be one of {one_of(setting.choices)}")
        elif kind == "patterns":
            if not isinstance(value, list) or not all(
                isinstance(item, str) and item for item in value
            ):
                raise self.error(
                    key,
                    value,
                    'expected a list of name patterns like ["orders", "logs.*"], '
                    f"got {toml_type(value)}",
                )
            return tuple(value)
        elif kind == "mode":
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise self.error(
                    key, value, f'expected an octal string like "0660", got {toml_type(value)}'
                )
        elif kind == "ids":
            if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
            ):
                raise self.error(key, value, "expected a list of numeric ids")
        elif kind == "names":
            if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
                raise self.error(key, value, "expected a list of non-empty strings")
        elif kind == "name" and (not isinstance(value, str) or not value):
            raise self.error(key, value, "expected a non-empty string")
        return value

    def _parse(self, key: str, setting: Setting, value: Any) -> Any:
        if setting.kind == "path":
            return self.path(key, value)
        if setting.kind == "mode":
            return self.permission_mode(key, value)
        return value

    def path(self, key: str, value: str) -> Path:
        """Relative to the file's folder, or to the current directory for a value from the
        environment or a default without a file."""
        if not value.strip():
            raise self.error(key, value, "must not be empty")
        path = Path(value).expanduser()
        base = Path.cwd() if key in self.from_env else self.base
        return path if path.is_absolute() else base / path

    def permission_mode(self, key: str, value: int | str) -> int:
        if isinstance(value, str):
            digits = value.strip().lower().removeprefix("0o")
            if not digits or any(c not in "01234567" for c in digits):
                raise self.error(key, value, 'expected an octal permission mode like "0660"')
            mode = int(digits, 8)
        else:
            mode = value
        if not 0 <= mode <= 0o777:
            hint = (
                ' (integers are decimal: write "0660" or 0o660)' if isinstance(value, int) else ""
            )
            raise self.error(key, value, f"must be a permission mode within 0..0777{hint}")
        return mode

    # -- settings objects -----------------------------------------------------------

    def construct(
        self,
        prefix: str,
        values: Mapping[str, Any],
        settings: Iterable[Setting],
        factory: Callable[..., _T],
        *args: Any,
        **kwargs: Any,
    ) -> _T:
        """Build a settings object; its ValueError becomes a ConfigError naming our key."""
        try:
            return factory(*args, **kwargs)
        except ValueError as exc:
            raise self._from_value_error(prefix, values, settings, exc) from exc

    def _from_value_error(
        self,
        prefix: str,
        values: Mapping[str, Any],
        settings: Iterable[Setting],
        exc: ValueError,
    ) -> ConfigError:
        text = str(exc)
        match = re.match(r"(\w+)=", text)
        if match is None:
            return ConfigError(f"{self.where(prefix)}: {text}", key=prefix)
        field_name = match.group(1)
        keys = {setting.target: setting.name for setting in settings}
        key = keys.get(field_name, field_name)
        key_name = f"{prefix}.{key}"
        if key not in values:
            return ConfigError(f"{self.where(key_name)}: {text}", key=key_name)
        value = values[key]
        for shown in (f"{field_name}={value!r}: ", f"{field_name}={value}: "):
            if text.startswith(shown):
                text = text[len(shown) :]
                break
        return self.error(key_name, value, text)


def model_kwargs(settings: Iterable[Setting], values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings object's arguments for the keys present in `values`."""
    return {
        setting.target: (values[setting.name] or None)
        if setting.zero_is_off
        else values[setting.name]
        for setting in settings
        if setting.name in values
    }
