"""The agent's configuration: one TOML file, then `EVENTSPOOL_*` environment overrides.

Each section's keys are declared below as `Setting`s (kind, default, bounds, meaning);
the generic loader (agent/config_loader.py) reads, types and checks them, and takes the
environment's overrides from the same declarations. What is left here are the rules
between keys: where the socket goes, a frame that can carry the largest event, a TCP
listener's need for TLS and for clients that prove who they are. Everything is checked
before the agent touches the spool, and every error names the key (or the environment
variable), the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from eventspool.agent.access import PeerRule
from eventspool.agent.config_loader import (
    ConfigError,
    Section,
    Setting,
    SettingsLoader,
    at_most,
    default_of,
    dotted,
    model_kwargs,
    positive,
    positive_finite,
    read_toml,
    toml_type,
)
from eventspool.agent.config_tables import access_rule, exchanges, kafka_config, topic_quotas
from eventspool.agent.tls import TlsFileError, TlsSettings, server_context
from eventspool.config import (
    DEFAULT_BUSY_POLL_US,
    Durability,
    FullPolicy,
    QueueSettings,
    SenderSettings,
    SpoolSettings,
    busy_poll_problem,
)
from eventspool.routing.exchanges import Exchange

DEFAULT_SOCKET_NAME = "agent.sock"

# A frame's length travels in 4 bytes.
_MAX_FRAME_BYTES = 0xFFFF_FFFF
# sun_path holds 108 bytes on Linux and 104 on macOS, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 103 if sys.platform == "darwin" else 107


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
    busy_poll_us: float = DEFAULT_BUSY_POLL_US  # the unix listener's wait tries this long
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


# ---- the declared settings ---------------------------------------------------------------
# docs/agent.md documents each key at length; tests/test_docs.py checks it names them all.


def _not_blank(value: str) -> str | None:
    return None if value.strip() else "must not be empty; leave it out to run without a sender"


AGENT = Section(
    "agent",
    (
        Setting("spool_dir", "path", "the spool directory the agent owns", default="spool"),
        Setting("socket", "path", "the unix socket; <spool_dir>/agent.sock when not set"),
        Setting(
            "socket_mode",
            "mode",
            "permissions of the socket file: who may send events",
            default=default_of(AgentConfig, "socket_mode"),
        ),
        Setting(
            "max_frame_bytes",
            "int",
            "largest frame and largest HTTP body",
            default=default_of(AgentConfig, "max_frame_bytes"),
            checks=(positive, at_most(_MAX_FRAME_BYTES)),
        ),
        Setting("tcp_listen", "str", '"host:port" of a TCP listener; none when not set'),
        Setting(
            "allow_remote",
            "bool",
            "a non-loopback TLS listener whose clients prove nothing is intended",
            default=False,
        ),
        Setting(
            "http", "bool", "the HTTP/1.1 JSON interface", default=default_of(AgentConfig, "http")
        ),
        Setting(
            "frame_timeout_s",
            "float",
            "a slower frame or HTTP request, or a silent new connection, is closed",
            default=default_of(AgentConfig, "frame_timeout_s"),
            checks=(positive_finite,),
        ),
        Setting(
            "shutdown_timeout_s",
            "float",
            "how long SIGTERM waits for in-flight acknowledgements",
            default=default_of(AgentConfig, "shutdown_timeout_s"),
            checks=(positive_finite,),
        ),
        Setting(
            "busy_poll_us",
            "float",
            "how long the unix listener's wait for its clients keeps trying before it blocks",
            default=default_of(AgentConfig, "busy_poll_us"),
            checks=(busy_poll_problem,),
        ),
        Setting("allowed_topics", "patterns", "glob patterns of the topics served; all if unset"),
        Setting(
            "allowed_exchanges", "patterns", "glob patterns of the exchanges served; all if unset"
        ),
    ),
)

_SCALAR_KINDS: dict[str, Literal["int", "float", "bool", "str"]] = {
    "int": "int",
    "float": "float",
    "bool": "bool",
    "str": "str",
}


def _sender_settings() -> tuple[Setting, ...]:
    """Every scalar field of SenderSettings is a key of [kafka], so new fields need no edit
    here; their bounds are SenderSettings' own."""
    settings = []
    for model_field in dataclasses.fields(SenderSettings):
        annotation = model_field.type
        type_name = (
            annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        )
        if type_name in _SCALAR_KINDS:
            doc = f"the sender's {model_field.name} (SenderSettings)"
            default = model_field.default
            settings.append(Setting(model_field.name, _SCALAR_KINDS[type_name], doc, default))
    return tuple(settings)


SENDER_SETTINGS = _sender_settings()
KAFKA = Section(
    "kafka",
    (
        Setting(
            "bootstrap_servers",
            "str",
            '"host:port,host:port" of the brokers; no sender when not set',
            checks=(_not_blank,),
        ),
        *SENDER_SETTINGS,
    ),
    tables=("config",),
)

# [spool]'s queue keys, which [topics.NAME] override; their bounds are QueueSettings' own.
QUEUE_SETTINGS = (
    Setting(
        "queue_bytes",
        "int",
        "the most a queue of a topic may hold, in segment files",
        default=default_of(QueueSettings, "capacity_bytes"),
        field="capacity_bytes",
    ),
    Setting(
        "segment_bytes",
        "int",
        "size of each segment file of a queue: one at rest, more under a backlog",
        default=default_of(QueueSettings, "segment_bytes"),
    ),
    Setting(
        "durability",
        "choice",
        "process: survives a killed agent; fsync: also a power cut",
        default=default_of(QueueSettings, "durability"),
        choices=tuple(member.value for member in Durability),
    ),
    Setting(
        "full_policy",
        "choice",
        "what a full queue does with a new event",
        default=default_of(QueueSettings, "full_policy"),
        choices=tuple(member.value for member in FullPolicy),
    ),
    Setting(
        "block_timeout_s",
        "float",
        "how long the block policy waits for room",
        default=default_of(QueueSettings, "block_timeout_s"),
    ),
)
# [spool]'s own keys; their bounds are SpoolSettings' own.
_SPOOL_LIMITS = (
    Setting(
        "max_event_bytes",
        "int",
        "largest event, as spooled",
        default=default_of(SpoolSettings, "max_event_bytes"),
    ),
    Setting(
        "sticky_batch_bytes",
        "int",
        "bytes of keyless events that stick to one partition",
        default=default_of(SpoolSettings, "sticky_batch_bytes"),
    ),
    Setting(
        "max_spool_bytes",
        "int",
        "the disk budget of the queue files; 0: none",
        default=default_of(SpoolSettings, "max_spool_bytes"),
        zero_is_off=True,
    ),
    Setting(
        "max_topics",
        "int",
        "most topics with queue files; 0: no limit",
        default=default_of(SpoolSettings, "max_topics"),
        zero_is_off=True,
    ),
)
SPOOL = Section("spool", (*_SPOOL_LIMITS, *QUEUE_SETTINGS))
QUOTAS = Section(
    "quotas",
    (Setting("client_bytes_per_s", "int", "per client; none when not set", checks=(positive,)),),
    tables=("topics",),
)
TLS = Section(
    "tls",
    (
        Setting("cert_file", "path", "the TCP listener's certificate chain (PEM)"),
        Setting("key_file", "path", "its private key (PEM)"),
        Setting("client_ca_file", "path", "CA certificates of client certificates (PEM)"),
    ),
)
# The sections of scalar settings, which the environment may override.
SECTIONS = (AGENT, KAFKA, SPOOL, QUOTAS, TLS)
# Sections of named tables: [topics.NAME] and [exchanges.NAME].
NAMED_TABLES = ("topics", "exchanges")


# ---- loading -------------------------------------------------------------------------------


def load_agent_config(path: Path | None, env: Mapping[str, str] | None = None) -> AgentConfig:
    """Read `path` (None: defaults only), apply the environment, check everything.

    Relative paths in the file are relative to the file's folder, so the file can move
    with its spool; relative paths from the environment or the defaults without a file
    are relative to the current directory, where the command was typed.
    """
    loader = SettingsLoader(path, SECTIONS, named_tables=NAMED_TABLES, arrays=("access",))
    raw = read_toml(path) if path is not None else {}
    tables = loader.structure(raw)
    _check_topic_tables(loader, tables["topics"])
    loader.apply_env(tables, os.environ if env is None else env)
    return _assemble(loader, tables)


def _check_topic_tables(loader: SettingsLoader, topics: Mapping[str, Any]) -> None:
    for topic, body in topics.items():
        key = dotted("topics", topic)
        loader.topic_name(key, topic)
        if not isinstance(body, dict):
            raise loader.error(
                key, body, f"expected a table of queue settings, got {toml_type(body)}"
            )
        loader.check_keys(key, body, (setting.name for setting in QUEUE_SETTINGS))


def _assemble(loader: SettingsLoader, tables: Mapping[str, Any]) -> AgentConfig:
    spool = _spool(loader, tables)
    sender, bootstrap = _sender(loader, tables["kafka"])
    agent = loader.values("agent", tables["agent"], AGENT.settings, defaults=True)

    spool_dir: Path = agent["spool_dir"]
    socket_path: Path = agent.get("socket", spool_dir / DEFAULT_SOCKET_NAME)
    if len(os.fsencode(socket_path)) > _MAX_SOCKET_PATH_BYTES:
        raise loader.error(
            "agent.socket",
            str(socket_path),
            f"a unix socket path may have at most {_MAX_SOCKET_PATH_BYTES} bytes; "
            "choose a shorter agent.socket",
        )
    max_frame = agent["max_frame_bytes"]
    if max_frame < spool.max_event_bytes:
        raise loader.error(
            "agent.max_frame_bytes",
            max_frame,
            f"must be at least spool.max_event_bytes ({spool.max_event_bytes}), "
            "or the largest events cannot reach the agent",
        )

    tcp = agent.get("tcp_listen")
    access = tuple(access_rule(loader, index, body) for index, body in enumerate(tables["access"]))
    tls = _tls(loader, tables["tls"], tcp)
    _check_tcp_proofs(loader, access, tls)
    quotas = loader.values("quotas", tables["quotas"], QUOTAS.settings)
    return AgentConfig(
        spool_dir=spool_dir,
        socket_path=socket_path,
        socket_mode=agent["socket_mode"],
        bootstrap_servers=bootstrap,
        max_frame_bytes=max_frame,
        tcp_listen=None
        if tcp is None
        else _tcp_listen(
            loader,
            tcp,
            allow_remote=agent["allow_remote"],
            tls=tls,
            tokens=any(rule.token_digests for rule in access),
        ),
        tls=tls,
        http=agent["http"],
        frame_timeout_s=agent["frame_timeout_s"],
        shutdown_timeout_s=agent["shutdown_timeout_s"],
        busy_poll_us=agent["busy_poll_us"],
        quota_client_bytes_per_s=quotas.get("client_bytes_per_s"),
        quota_topic_bytes_per_s=topic_quotas(loader, tables["quotas"].get("topics", {})),
        spool=spool,
        sender=sender,
        exchanges=exchanges(loader, tables["exchanges"]),
        allowed_topics=agent.get("allowed_topics"),
        allowed_exchanges=agent.get("allowed_exchanges"),
        access=access,
    )


def _spool(loader: SettingsLoader, tables: Mapping[str, Any]) -> SpoolSettings:
    """[spool]'s queue settings are every topic's default; [topics.NAME] override them."""
    values = loader.values("spool", tables["spool"], SPOOL.settings)
    default = loader.construct(
        "spool", values, SPOOL.settings, QueueSettings, **model_kwargs(QUEUE_SETTINGS, values)
    )
    topics: dict[str, QueueSettings] = {}
    for topic, body in tables["topics"].items():
        prefix = dotted("topics", topic)
        overrides = loader.values(prefix, body, QUEUE_SETTINGS)
        topics[topic] = loader.construct(
            prefix,
            overrides,
            QUEUE_SETTINGS,
            dataclasses.replace,
            default,
            **model_kwargs(QUEUE_SETTINGS, overrides),
        )
    return loader.construct(
        "spool",
        values,
        SPOOL.settings,
        SpoolSettings,
        queue=default,
        topics=topics,
        **model_kwargs(_SPOOL_LIMITS, values),
    )


def _sender(loader: SettingsLoader, body: Mapping[str, Any]) -> tuple[SenderSettings, str | None]:
    values = loader.values("kafka", body, KAFKA.settings)
    bootstrap = values.pop("bootstrap_servers", None)
    kafka = kafka_config(loader, body.get("config", {}))
    sender = loader.construct(
        "kafka",
        values,
        SENDER_SETTINGS,
        SenderSettings,
        kafka=kafka,
        **model_kwargs(SENDER_SETTINGS, values),
    )
    return sender, bootstrap


def _tls(loader: SettingsLoader, body: Mapping[str, Any], tcp: str | None) -> TlsSettings | None:
    """[tls]: both files or neither; they are loaded here, so a bad one stops the start."""
    values = loader.values("tls", body, TLS.settings)
    if not values:
        return None
    given = next(iter(values))
    for key in ("cert_file", "key_file"):
        if key not in values:
            raise ConfigError(
                f"{loader.where(f'tls.{given}')} is set but tls.{key} is not; "
                "TLS needs both tls.cert_file and tls.key_file",
                key=f"tls.{key}",
            )
    if tcp is None:
        raise ConfigError(
            f"{loader.where('tls.cert_file')}: TLS is for the TCP listener, and "
            "agent.tcp_listen is not set",
            key="tls.cert_file",
        )
    settings = TlsSettings(values["cert_file"], values["key_file"], values.get("client_ca_file"))
    try:
        server_context(settings)
    except TlsFileError as exc:
        raise ConfigError(f"{loader.where(exc.key)}: {exc}", key=exc.key) from exc
    return settings


def _check_tcp_proofs(
    loader: SettingsLoader, access: tuple[PeerRule, ...], tls: TlsSettings | None
) -> None:
    """Certificate names need client certificates; tokens must not travel in clear."""
    for index, rule in enumerate(access):
        if rule.cert_cns and (tls is None or tls.client_ca_file is None):
            raise ConfigError(
                f"{loader.where(f'access[{index}].cert_cns')}: clients are asked for a "
                "certificate only with tls.client_ca_file, which is not set",
                key=f"access[{index}].cert_cns",
            )
        if rule.token_digests and tls is None:
            raise ConfigError(
                f"{loader.where(f'access[{index}].token_sha256')}: tokens are taken only "
                "over TLS; set agent.tcp_listen, tls.cert_file and tls.key_file",
                key=f"access[{index}].token_sha256",
            )


def _tcp_listen(
    loader: SettingsLoader, value: str, *, allow_remote: bool, tls: TlsSettings | None, tokens: bool
) -> str:
    """A loopback address may be plaintext; any other needs TLS, and TLS that asks
    clients for nothing (no client CA, no token) needs `allow_remote` as well."""
    key = "agent.tcp_listen"
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit() or not host:
        raise loader.error(key, value, 'expected "host:port", e.g. "127.0.0.1:7070"')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise loader.error(key, value, 'IPv6 addresses need brackets, e.g. "[::1]:7070"')
    if not 1 <= int(port_text) <= 65535:
        raise loader.error(key, value, "the port must be within 1..65535")
    if _is_loopback(host):
        return value
    if tls is None:
        raise loader.error(
            key,
            value,
            f"{host} is not a loopback address: other hosts could connect, and they "
            "are served only over TLS; set tls.cert_file and tls.key_file",
        )
    if not allow_remote and tls.client_ca_file is None and not tokens:
        raise loader.error(
            key,
            value,
            f"{host} is not a loopback address and clients prove nothing (neither "
            "tls.client_ca_file nor an [[access]] rule with token_sha256 is set): "
            "anyone who reaches the port could send events; set agent.allow_remote = "
            "true if that is intended",
        )
    return value


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere
