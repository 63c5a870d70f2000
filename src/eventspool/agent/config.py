"""The agent's configuration: one TOML file, then `EVENTSPOOL_*` environment overrides.

Everything is checked before the agent touches the spool, and every error names the key
(or the environment variable), the bad value and what is allowed: the operator who reads
it has the file open, not the source.
"""

from __future__ import annotations

import dataclasses
import difflib
import grp
import ipaddress
import json
import math
import os
import pwd
import re
import sys
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from eventspool.agent.access import PeerRule
from eventspool.agent.tls import TlsFileError, TlsSettings, server_context
from eventspool.config import (
    Durability,
    FullPolicy,
    KafkaConfigValue,
    QueueSettings,
    SenderSettings,
    SpoolSettings,
    validate_topic,
)
from eventspool.errors import EventspoolError, InvalidEventError, InvalidExchangeError
from eventspool.routing.exchanges import (
    Binding,
    Exchange,
    ExchangeType,
    validate_exchange_name,
)

ENV_PREFIX = "EVENTSPOOL_"
DEFAULT_SPOOL_DIR = "spool"
DEFAULT_SOCKET_NAME = "agent.sock"

# A frame's length travels in 4 bytes.
_MAX_FRAME_BYTES = 0xFFFF_FFFF
# sun_path holds 108 bytes on Linux and 104 on macOS, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 103 if sys.platform == "darwin" else 107


class ConfigError(EventspoolError):
    """The configuration cannot be used; the message names the key, the value and the rule.

    `key` is the dotted key ("spool.durability") when one key is at fault, so that tools
    can point at it without parsing the message.
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything the agent needs to start; paths are absolute so a later chdir is harmless."""

    spool_dir: Path
    socket_path: Path
    socket_mode: int = 0o660
    bootstrap_servers: str | None = None  # None: spool only, no sender
    max_frame_bytes: int = 16 * 1024 * 1024
    tcp_listen: str | None = None  # "host:port"; off unless configured
    tls: TlsSettings | None = None  # [tls]: the TCP listener's certificate, key, client CA
    http: bool = True  # HTTP/1.1 JSON interface on the same socket
    frame_timeout_s: float = 30.0  # a frame or HTTP request slower than this closes its connection
    shutdown_timeout_s: float = 10.0  # how long SIGTERM waits for in-flight acknowledgements
    quota_client_bytes_per_s: int | None = None
    quota_topic_bytes_per_s: Mapping[str, int] = field(default_factory=dict)
    spool: SpoolSettings = field(default_factory=SpoolSettings)
    sender: SenderSettings = field(default_factory=SenderSettings)
    exchanges: tuple[Exchange, ...] = ()
    # Glob patterns of the names served; None: every valid name (agent/access.py).
    allowed_topics: tuple[str, ...] | None = None
    allowed_exchanges: tuple[str, ...] | None = None
    # [[access]]: what each local uid or gid, certificate name or token may use
    access: tuple[PeerRule, ...] = ()


_Kind = Literal["int", "float", "bool", "str", "mode", "patterns"]
_T = TypeVar("_T")

_AGENT_KEYS: dict[str, _Kind] = {
    "spool_dir": "str",
    "socket": "str",
    "socket_mode": "mode",
    "max_frame_bytes": "int",
    "tcp_listen": "str",
    "allow_remote": "bool",
    "http": "bool",
    "frame_timeout_s": "float",
    "shutdown_timeout_s": "float",
    "allowed_topics": "patterns",
    "allowed_exchanges": "patterns",
}


def _sender_keys() -> dict[str, _Kind]:
    """Every scalar field of SenderSettings is a key of [kafka], so new fields need no edit here."""
    kinds: dict[str, _Kind] = {"int": "int", "float": "float", "bool": "bool", "str": "str"}
    keys: dict[str, _Kind] = {}
    for f in dataclasses.fields(SenderSettings):
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", "")
        if type_name in kinds:
            keys[f.name] = kinds[type_name]
    return keys


_QUEUE_KEYS: dict[str, _Kind] = {
    "queue_bytes": "int",
    "durability": "str",
    "full_policy": "str",
    "block_timeout_s": "float",
}
# Config key -> QueueSettings field, where the names differ.
_QUEUE_FIELDS = {"queue_bytes": "capacity_bytes"}
_ENUMS: dict[str, tuple[str, ...]] = {
    "durability": tuple(member.value for member in Durability),
    "full_policy": tuple(member.value for member in FullPolicy),
}

# The sections whose scalar keys the environment may override, and their sub-tables.
_SCALARS: dict[str, dict[str, _Kind]] = {
    "agent": _AGENT_KEYS,
    "kafka": {"bootstrap_servers": "str", **_sender_keys()},
    "spool": {
        "max_event_bytes": "int",
        "sticky_batch_bytes": "int",
        "max_spool_bytes": "int",
        "max_topics": "int",
        **_QUEUE_KEYS,
    },
    "quotas": {"client_bytes_per_s": "int"},
    "tls": {"cert_file": "str", "key_file": "str", "client_ca_file": "str"},
}
_TABLES: dict[str, tuple[str, ...]] = {
    "agent": (),
    "kafka": ("config",),
    "spool": (),
    "quotas": ("topics",),
    "tls": (),
}
_SECTIONS = (*_SCALARS, "topics", "exchanges")
_ACCESS_KEYS = (
    "name",
    "uids",
    "users",
    "gids",
    "groups",
    "cert_cns",
    "token_sha256",
    "topics",
    "exchanges",
)
_EXCHANGE_KEYS = ("type", "bindings", "alternate_topic")
_BINDING_KEYS = ("topic", "key")
_EXCHANGE_TYPES = ", ".join(json.dumps(member.value) for member in ExchangeType)

# librdkafka settings that have a typed key of their own: two places for one setting
# would leave the reader guessing which one wins.
_KAFKA_TYPED = {
    "bootstrap.servers": "kafka.bootstrap_servers",
    "metadata.broker.list": "kafka.bootstrap_servers",
    "compression.type": "kafka.compression",
    "compression.codec": "kafka.compression",
    "linger.ms": "kafka.linger_ms",
    "queue.buffering.max.ms": "kafka.linger_ms",
    "batch.size": "kafka.batch_size",
}
# Settings the sender always overrides, because delivery guarantees depend on them.
_KAFKA_FORCED = frozenset(
    {
        "enable.idempotence",
        "acks",
        "request.required.acks",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "error_cb",
        "on_delivery",
        "dr_cb",
        "dr_msg_cb",
        "logger",
    }
)

_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def _env_name(section: str, key: str) -> str:
    return ENV_PREFIX + f"{section}_{key}".upper().replace(".", "_").replace("-", "_")


_ENV_VARS: dict[str, tuple[str, str]] = {
    _env_name(section, key): (section, key) for section, keys in _SCALARS.items() for key in keys
}
# Variables under these prefixes are ours: an unknown one is a typo, not someone else's.
_ENV_SECTION_PREFIXES = tuple(f"{ENV_PREFIX}{section.upper()}_" for section in _SCALARS)


def load_agent_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Read `path` (None: defaults only), apply the environment, check everything.

    Relative paths in the file are relative to the file's folder, so the file can move
    with its spool; relative paths from the environment or the defaults without a file
    are relative to the current directory, where the command was typed.
    """
    loader = _Loader(path)
    raw = _read_toml(path) if path is not None else {}
    sections = loader.structure(raw)
    loader.apply_env(sections, os.environ if env is None else env)
    return loader.build(sections)


def _read_toml(path: Path) -> dict[str, Any]:
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


def _dotted(*parts: str) -> str:
    """Join key parts as TOML would write them, quoting the ones that are not bare keys."""
    return ".".join(p if re.fullmatch(r"[A-Za-z0-9_-]+", p) else json.dumps(p) for p in parts)


def _show(value: object) -> str:
    """Render a value the way it is written in TOML, which is what the reader has in front."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _toml_type(value: object) -> str:
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


def _close(name: str, options: Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return matches[0] if matches else None


class _Loader:
    """Holds where each value came from, so that errors can name the file or the variable."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self.base = file.absolute().parent if file is not None else Path.cwd()
        self.from_env: dict[str, str] = {}  # dotted key -> environment variable
        self.access_tables: list[Mapping[str, Any]] = []

    # -- messages -------------------------------------------------------------------

    def where(self, key: str) -> str:
        variable = self.from_env.get(key)
        if variable is not None:
            return f"{variable} ({key})"
        return f"{self.file}: {key}" if self.file is not None else key

    def error(self, key: str, value: object, problem: str) -> ConfigError:
        return ConfigError(f"{self.where(key)} = {_show(value)}: {problem}", key=key)

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

    # -- structure ------------------------------------------------------------------

    def structure(self, raw: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """Reject unknown sections and keys before any value is looked at."""
        sections: dict[str, dict[str, Any]] = {}
        for name, body in raw.items():
            if name == "access":  # [[access]]: an array of tables, read by _access()
                if not isinstance(body, list) or not all(isinstance(rule, dict) for rule in body):
                    raise self.error("access", body, "expected [[access]] tables")
                self.access_tables = list(body)
                continue
            if name not in _SECTIONS:
                if not isinstance(body, dict):
                    # A key above every section: probably a forgotten [section] header.
                    homes = [f"{s}.{name}" for s, keys in _SCALARS.items() if name in keys]
                    hint = homes[0] if homes else None
                    raise self.unknown(_dotted(name), "top-level key", (), hint)
                close = _close(name, _SECTIONS)
                raise self.unknown(
                    f"[{name}]", "section", (f"[{s}]" for s in _SECTIONS), close and f"[{close}]"
                )
            if not isinstance(body, dict):
                raise self.error(name, body, f"expected a table ([{name}]), got {_toml_type(body)}")
            sections[name] = dict(body)
        for section, keys in _SCALARS.items():
            body = sections.setdefault(section, {})
            for key, value in body.items():
                if key in keys:
                    continue
                dotted = _dotted(section, key)
                if key not in _TABLES[section]:
                    raise self.unknown(
                        dotted, "key", (*keys, *_TABLES[section]), self._hint(section, key)
                    )
                if not isinstance(value, dict):
                    raise self.error(dotted, value, f"expected a table, got {_toml_type(value)}")
        sections.setdefault("exchanges", {})
        topics = sections.setdefault("topics", {})
        for topic, body in topics.items():
            key = _dotted("topics", topic)
            self._topic_name(key, topic)
            if not isinstance(body, dict):
                raise self.error(
                    key, body, f"expected a table of queue settings, got {_toml_type(body)}"
                )
            for name in body:
                if name not in _QUEUE_KEYS:
                    close = _close(name, _QUEUE_KEYS)
                    raise self.unknown(
                        _dotted("topics", topic, name),
                        "key",
                        _QUEUE_KEYS,
                        close and _dotted("topics", topic, close),
                    )
        return sections

    def _hint(self, section: str, key: str) -> str | None:
        close = _close(key, (*_SCALARS[section], *_TABLES[section]))
        if close is not None:
            return _dotted(section, close)
        homes = [_dotted(s, key) for s, keys in _SCALARS.items() if key in keys and s != section]
        return homes[0] if homes else None

    def _topic_name(self, key: str, topic: str) -> None:
        try:
            validate_topic(topic)
        except InvalidEventError as exc:
            raise ConfigError(f"{self.where(key)}: {exc}", key=key) from exc

    # -- environment ----------------------------------------------------------------

    def apply_env(self, sections: dict[str, dict[str, Any]], env: Mapping[str, str]) -> None:
        """Override scalar keys; an empty variable means "not set" (back to the default)."""
        for variable in sorted(env):
            target = _ENV_VARS.get(variable)
            if target is None:
                if variable.startswith(_ENV_SECTION_PREFIXES):
                    raise ConfigError(
                        f"unknown environment variable {variable}"
                        + (
                            f"; did you mean {close}?"
                            if (close := _close(variable, _ENV_VARS))
                            else ""
                        )
                    )
                continue
            section, key = target
            dotted = _dotted(section, key)
            self.from_env[dotted] = variable
            text = env[variable]
            if text == "":
                sections[section].pop(key, None)
                del self.from_env[dotted]
                continue
            sections[section][key] = self._parse_env(variable, dotted, text, _SCALARS[section][key])

    def _parse_env(self, variable: str, dotted: str, text: str, kind: _Kind) -> object:
        def fail(expected: str) -> ConfigError:
            return ConfigError(
                f"{variable} = {json.dumps(text)}: expected {expected} for {dotted}", key=dotted
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
        return text  # str, and socket modes, which are parsed like the file's strings

    # -- values ---------------------------------------------------------------------

    def typed(
        self, section: str, body: Mapping[str, Any], kinds: Mapping[str, _Kind]
    ) -> dict[str, Any]:
        """The keys present in `body`, each checked against its kind (ints pass as floats)."""
        out: dict[str, Any] = {}
        for key, kind in kinds.items():
            if key not in body:
                continue
            value = body[key]
            dotted = f"{section}.{key}"
            if kind == "int":
                if isinstance(value, bool) or not isinstance(value, int):
                    raise self.error(dotted, value, f"expected an integer, got {_toml_type(value)}")
            elif kind == "float":
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise self.error(dotted, value, f"expected a number, got {_toml_type(value)}")
                if math.isnan(value):
                    raise self.error(dotted, value, "expected a number, got nan")
                value = float(value)
            elif kind == "bool":
                if not isinstance(value, bool):
                    raise self.error(
                        dotted, value, f"expected true or false, got {_toml_type(value)}"
                    )
            elif kind == "str":
                if not isinstance(value, str):
                    raise self.error(dotted, value, f"expected a string, got {_toml_type(value)}")
                if key in _ENUMS and value not in _ENUMS[key]:
                    allowed = ", ".join(json.dumps(v) for v in _ENUMS[key])
                    raise self.error(dotted, value, f"must be one of {allowed}")
            elif kind == "patterns":
                if not isinstance(value, list) or not all(
                    isinstance(item, str) and item for item in value
                ):
                    raise self.error(
                        dotted,
                        value,
                        'expected a list of name patterns like ["orders", "logs.*"], '
                        f"got {_toml_type(value)}",
                    )
                value = tuple(value)
            elif kind == "mode" and (isinstance(value, bool) or not isinstance(value, int | str)):
                raise self.error(
                    dotted, value, f'expected an octal string like "0660", got {_toml_type(value)}'
                )
            out[key] = value
        return out

    def construct(
        self,
        prefix: str,
        values: Mapping[str, Any],
        factory: Callable[..., _T],
        *args: Any,
        **kwargs: Any,
    ) -> _T:
        """Build a settings object; its ValueError becomes a ConfigError naming our key."""
        try:
            return factory(*args, **kwargs)
        except ValueError as exc:
            raise self._from_value_error(prefix, values, exc) from exc

    def _from_value_error(
        self, prefix: str, values: Mapping[str, Any], exc: ValueError
    ) -> ConfigError:
        text = str(exc)
        match = re.match(r"(\w+)=", text)
        if match is None:
            return ConfigError(f"{self.where(prefix)}: {text}", key=prefix)
        field_name = match.group(1)
        keys = {v: k for k, v in _QUEUE_FIELDS.items()}
        key = keys.get(field_name, field_name)
        dotted = f"{prefix}.{key}"
        if key not in values:
            return ConfigError(f"{self.where(dotted)}: {text}", key=dotted)
        value = values[key]
        for shown in (f"{field_name}={value!r}: ", f"{field_name}={value}: "):
            if text.startswith(shown):
                text = text[len(shown) :]
                break
        return self.error(dotted, value, text)

    def path(self, key: str, value: str) -> Path:
        if not value.strip():
            raise self.error(key, value, "must not be empty")
        path = Path(value).expanduser()
        base = Path.cwd() if key in self.from_env else self.base
        return path if path.is_absolute() else base / path

    def socket_mode(self, value: int | str) -> int:
        key = "agent.socket_mode"
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

    def tcp_listen(
        self, value: str, *, allow_remote: bool, tls: TlsSettings | None, tokens: bool
    ) -> str:
        """A loopback address may be plaintext; any other needs TLS, and TLS that asks
        clients for nothing (no client CA, no token) needs `allow_remote` as well."""
        key = "agent.tcp_listen"
        host, sep, port_text = value.rpartition(":")
        if not sep or not port_text.isdigit() or not host:
            raise self.error(key, value, 'expected "host:port", e.g. "127.0.0.1:7070"')
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            raise self.error(key, value, 'IPv6 addresses need brackets, e.g. "[::1]:7070"')
        if not 1 <= int(port_text) <= 65535:
            raise self.error(key, value, "the port must be within 1..65535")
        if _is_loopback(host):
            return value
        if tls is None:
            raise self.error(
                key,
                value,
                f"{host} is not a loopback address: other hosts could connect, and they "
                "are served only over TLS; set tls.cert_file and tls.key_file",
            )
        if not allow_remote and tls.client_ca_file is None and not tokens:
            raise self.error(
                key,
                value,
                f"{host} is not a loopback address and clients prove nothing (neither "
                "tls.client_ca_file nor an [[access]] rule with token_sha256 is set): "
                "anyone who reaches the port could send events; set agent.allow_remote = "
                "true if that is intended",
            )
        return value

    def positive(self, key: str, value: int) -> int:
        if value < 1:
            raise self.error(key, value, "must be positive")
        return value

    def positive_float(self, key: str, value: float) -> float:
        if value <= 0 or math.isinf(value):
            raise self.error(key, value, "must be positive and finite")
        return float(value)

    # -- assembly -------------------------------------------------------------------

    def build(self, sections: Mapping[str, Mapping[str, Any]]) -> AgentConfig:
        spool = self._spool(sections)
        sender, bootstrap = self._sender(sections["kafka"])
        agent = self.typed("agent", sections["agent"], _AGENT_KEYS)

        spool_dir = self.path("agent.spool_dir", agent.get("spool_dir", DEFAULT_SPOOL_DIR))
        if "socket" in agent:
            socket_path = self.path("agent.socket", agent["socket"])
        else:
            socket_path = spool_dir / DEFAULT_SOCKET_NAME
        if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH_BYTES:
            raise self.error(
                "agent.socket",
                str(socket_path),
                f"a unix socket path may have at most {_MAX_SOCKET_PATH_BYTES} bytes; "
                "choose a shorter agent.socket",
            )

        max_frame = self.positive("agent.max_frame_bytes", agent.get("max_frame_bytes", 16 << 20))
        if max_frame > _MAX_FRAME_BYTES:
            raise self.error(
                "agent.max_frame_bytes", max_frame, f"must be at most {_MAX_FRAME_BYTES}"
            )
        if max_frame < spool.max_event_bytes:
            raise self.error(
                "agent.max_frame_bytes",
                max_frame,
                f"must be at least spool.max_event_bytes ({spool.max_event_bytes}), "
                "or the largest events cannot reach the agent",
            )

        tcp = agent.get("tcp_listen")
        access = tuple(
            self._access_rule(index, body) for index, body in enumerate(self.access_tables)
        )
        tls = self._tls(sections["tls"], tcp)
        self._check_tcp_proofs(access, tls)
        quotas = self.typed("quotas", sections["quotas"], _SCALARS["quotas"])
        client_quota = quotas.get("client_bytes_per_s")
        return AgentConfig(
            spool_dir=spool_dir,
            socket_path=socket_path,
            socket_mode=self.socket_mode(agent.get("socket_mode", 0o660)),
            bootstrap_servers=bootstrap,
            max_frame_bytes=max_frame,
            tcp_listen=None
            if tcp is None
            else self.tcp_listen(
                tcp,
                allow_remote=agent.get("allow_remote", False),
                tls=tls,
                tokens=any(rule.token_digests for rule in access),
            ),
            tls=tls,
            http=agent.get("http", True),
            frame_timeout_s=self.positive_float(
                "agent.frame_timeout_s", agent.get("frame_timeout_s", 30.0)
            ),
            shutdown_timeout_s=self.positive_float(
                "agent.shutdown_timeout_s", agent.get("shutdown_timeout_s", 10.0)
            ),
            quota_client_bytes_per_s=(
                None
                if client_quota is None
                else self.positive("quotas.client_bytes_per_s", client_quota)
            ),
            quota_topic_bytes_per_s=self._topic_quotas(sections["quotas"].get("topics", {})),
            spool=spool,
            sender=sender,
            exchanges=self._exchanges(sections["exchanges"]),
            allowed_topics=agent.get("allowed_topics"),
            allowed_exchanges=agent.get("allowed_exchanges"),
            access=access,
        )

    def _tls(self, body: Mapping[str, Any], tcp: str | None) -> TlsSettings | None:
        """[tls]: both files or neither; they are loaded here, so a bad one stops the start."""
        values = self.typed("tls", body, _SCALARS["tls"])
        if not values:
            return None
        given = next(iter(values))
        for key in ("cert_file", "key_file"):
            if key not in values:
                raise ConfigError(
                    f"{self.where(f'tls.{given}')} is set but tls.{key} is not; "
                    "TLS needs both tls.cert_file and tls.key_file",
                    key=f"tls.{key}",
                )
        if tcp is None:
            raise ConfigError(
                f"{self.where('tls.cert_file')}: TLS is for the TCP listener, and "
                "agent.tcp_listen is not set",
                key="tls.cert_file",
            )
        client_ca = values.get("client_ca_file")
        settings = TlsSettings(
            self.path("tls.cert_file", values["cert_file"]),
            self.path("tls.key_file", values["key_file"]),
            None if client_ca is None else self.path("tls.client_ca_file", client_ca),
        )
        try:
            server_context(settings)
        except TlsFileError as exc:
            raise ConfigError(f"{self.where(exc.key)}: {exc}", key=exc.key) from exc
        return settings

    def _check_tcp_proofs(self, access: tuple[PeerRule, ...], tls: TlsSettings | None) -> None:
        """Certificate names need client certificates; tokens must not travel in clear."""
        for index, rule in enumerate(access):
            if rule.cert_cns and (tls is None or tls.client_ca_file is None):
                raise ConfigError(
                    f"{self.where(f'access[{index}].cert_cns')}: clients are asked for a "
                    "certificate only with tls.client_ca_file, which is not set",
                    key=f"access[{index}].cert_cns",
                )
            if rule.token_digests and tls is None:
                raise ConfigError(
                    f"{self.where(f'access[{index}].token_sha256')}: tokens are taken only "
                    "over TLS; set agent.tcp_listen, tls.cert_file and tls.key_file",
                    key=f"access[{index}].token_sha256",
                )

    def _access_rule(self, index: int, body: Mapping[str, Any]) -> PeerRule:
        """One [[access]] table: the uids/users and gids/groups it matches (or, on TCP, the
        certificate names and tokens), and the topic and exchange patterns it grants them."""
        prefix = f"access[{index}]"
        for key in body:
            if key not in _ACCESS_KEYS:
                close = _close(key, _ACCESS_KEYS)
                raise self.unknown(
                    f"{prefix}.{key}", "key", _ACCESS_KEYS, close and f"{prefix}.{close}"
                )
        name = body.get("name", prefix)
        if not isinstance(name, str) or not name:
            raise self.error(f"{prefix}.name", name, "expected a non-empty string")
        uids = set(self._ids(prefix, body, "uids"))
        gids = set(self._ids(prefix, body, "gids"))
        for user in self._names(prefix, body, "users"):
            try:
                uids.add(pwd.getpwnam(user).pw_uid)
            except KeyError:
                raise self.error(f"{prefix}.users", user, "no such user on this host") from None
        for group in self._names(prefix, body, "groups"):
            try:
                gids.add(grp.getgrnam(group).gr_gid)
            except KeyError:
                raise self.error(f"{prefix}.groups", group, "no such group on this host") from None
        cert_cns = frozenset(self._names(prefix, body, "cert_cns"))
        digests = tuple(
            self._token_digest(f"{prefix}.token_sha256", value)
            for value in self._names(prefix, body, "token_sha256")
        )
        if not uids and not gids and not cert_cns and not digests:
            raise ConfigError(
                f"{self.where(prefix)}: matches nobody; give uids, users, gids, groups, "
                "cert_cns or token_sha256",
                key=prefix,
            )
        return PeerRule(
            name,
            frozenset(uids),
            frozenset(gids),
            tuple(self._names(prefix, body, "topics")),
            tuple(self._names(prefix, body, "exchanges")),
            cert_cns,
            digests,
        )

    def _token_digest(self, key: str, value: str) -> bytes:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
            raise self.error(
                key,
                value,
                'expected the SHA-256 of a token as 64 hex digits (printf %s "$TOKEN" | sha256sum)',
            )
        return bytes.fromhex(value)

    def _ids(self, prefix: str, body: Mapping[str, Any], key: str) -> list[int]:
        values = body.get(key, [])
        if not isinstance(values, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
        ):
            raise self.error(f"{prefix}.{key}", values, "expected a list of numeric ids")
        return values

    def _names(self, prefix: str, body: Mapping[str, Any], key: str) -> list[str]:
        values = body.get(key, [])
        if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
            raise self.error(f"{prefix}.{key}", values, "expected a list of non-empty strings")
        return values

    def _spool(self, sections: Mapping[str, Mapping[str, Any]]) -> SpoolSettings:
        values = self.typed("spool", sections["spool"], _SCALARS["spool"])
        default = self.construct("spool", values, QueueSettings, **_queue_kwargs(values))
        topics: dict[str, QueueSettings] = {}
        for topic, body in sections["topics"].items():
            prefix = _dotted("topics", topic)
            overrides = self.typed(prefix, body, _QUEUE_KEYS)
            topics[topic] = self.construct(
                prefix, overrides, dataclasses.replace, default, **_queue_kwargs(overrides)
            )
        spool_kwargs: dict[str, int | None] = {
            k: values[k] for k in ("max_event_bytes", "sticky_batch_bytes") if k in values
        }
        for limit in ("max_spool_bytes", "max_topics"):  # 0 turns the limit off
            if limit in values:
                spool_kwargs[limit] = values[limit] or None
        return self.construct(
            "spool", values, SpoolSettings, queue=default, topics=topics, **spool_kwargs
        )

    def _sender(self, body: Mapping[str, Any]) -> tuple[SenderSettings, str | None]:
        values = self.typed("kafka", body, _SCALARS["kafka"])
        bootstrap = values.pop("bootstrap_servers", None)
        if bootstrap is not None and not bootstrap.strip():
            raise self.error(
                "kafka.bootstrap_servers",
                bootstrap,
                "must not be empty; leave it out to run without a sender",
            )
        kafka = self._kafka_config(body.get("config", {}))
        return self.construct("kafka", values, SenderSettings, kafka=kafka, **values), bootstrap

    def _kafka_config(self, table: Mapping[str, Any]) -> dict[str, KafkaConfigValue]:
        """Flatten unquoted dotted keys (security.protocol = ...) back into librdkafka's names."""
        out: dict[str, KafkaConfigValue] = {}

        def walk(prefix: str, node: Mapping[str, Any]) -> None:
            for name, value in node.items():
                setting = f"{prefix}.{name}" if prefix else name
                if isinstance(value, dict):
                    walk(setting, value)
                    continue
                key = _dotted("kafka", "config", setting)
                if setting in _KAFKA_TYPED:
                    raise self.error(key, value, f"set {_KAFKA_TYPED[setting]} instead")
                if setting in _KAFKA_FORCED:
                    raise self.error(
                        key, value, "eventspool sets this itself, because delivery depends on it"
                    )
                if not isinstance(value, str | int | float):  # bool is an int
                    raise self.error(
                        key,
                        value,
                        f"expected a string, number or boolean, got {_toml_type(value)}",
                    )
                out[setting] = value

        walk("", table)
        return out

    def _exchanges(self, table: Mapping[str, Any]) -> tuple[Exchange, ...]:
        """[exchanges.NAME] tables: type, bindings = [{topic, key}], alternate_topic."""
        return tuple(self._exchange(name, body) for name, body in table.items())

    def _exchange(self, name: str, body: Any) -> Exchange:
        prefix = _dotted("exchanges", name)
        try:
            validate_exchange_name(name)
        except InvalidExchangeError as exc:
            raise ConfigError(f"{self.where(prefix)}: {exc}", key=prefix) from exc
        if not isinstance(body, dict):
            raise self.error(prefix, body, f"expected a table, got {_toml_type(body)}")
        for key in body:
            if key not in _EXCHANGE_KEYS:
                close = _close(key, _EXCHANGE_KEYS)
                raise self.unknown(
                    _dotted("exchanges", name, key),
                    "key",
                    _EXCHANGE_KEYS,
                    close and _dotted("exchanges", name, close),
                )
        if "type" not in body:
            raise ConfigError(
                f"{self.where(prefix)}: type is missing; use one of {_EXCHANGE_TYPES}",
                key=f"{prefix}.type",
            )
        kind = body["type"]
        if kind not in tuple(member.value for member in ExchangeType):
            raise self.error(f"{prefix}.type", kind, f"must be one of {_EXCHANGE_TYPES}")
        alternate = body.get("alternate_topic")
        if alternate is not None:
            if not isinstance(alternate, str):
                raise self.error(
                    f"{prefix}.alternate_topic",
                    alternate,
                    f"expected a topic name, got {_toml_type(alternate)}",
                )
            self._topic_name(f"{prefix}.alternate_topic", alternate)
        try:
            return Exchange(name, ExchangeType(kind), self._bindings(prefix, body), alternate)
        except InvalidExchangeError as exc:
            raise ConfigError(f"{self.where(prefix)}: {exc}", key=prefix) from exc

    def _bindings(self, prefix: str, body: Mapping[str, Any]) -> tuple[Binding, ...]:
        raw = body.get("bindings", [])
        key = f"{prefix}.bindings"
        if not isinstance(raw, list):
            raise self.error(
                key,
                raw,
                f'expected an array like [{{ topic = "t", key = "a.*" }}], got {_toml_type(raw)}',
            )
        bindings = []
        for index, item in enumerate(raw):
            where = f"{key}[{index}]"
            if not isinstance(item, dict):
                raise self.error(
                    where,
                    item,
                    f'expected a table like {{ topic = "t", key = "a.*" }}, got {_toml_type(item)}',
                )
            for name in item:
                if name not in _BINDING_KEYS:
                    raise self.unknown(f"{where}.{name}", "key", _BINDING_KEYS, None)
            topic = item.get("topic")
            if not isinstance(topic, str):
                raise ConfigError(
                    f"{self.where(where)}: topic is missing or not a string", key=f"{where}.topic"
                )
            self._topic_name(f"{where}.topic", topic)
            binding_key = item.get("key", "")
            if not isinstance(binding_key, str):
                raise self.error(
                    f"{where}.key", binding_key, f"expected a string, got {_toml_type(binding_key)}"
                )
            bindings.append(Binding(topic, binding_key))
        return tuple(bindings)

    def _topic_quotas(self, table: Mapping[str, Any]) -> dict[str, int]:
        out: dict[str, int] = {}
        for topic, value in table.items():
            key = _dotted("quotas", "topics", topic)
            self._topic_name(key, topic)
            if isinstance(value, bool) or not isinstance(value, int):
                raise self.error(key, value, f"expected an integer, got {_toml_type(value)}")
            out[topic] = self.positive(key, value)
        return out


def _queue_kwargs(values: Mapping[str, Any]) -> dict[str, Any]:
    return {_QUEUE_FIELDS.get(k, k): v for k, v in values.items() if k in _QUEUE_KEYS}


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere
