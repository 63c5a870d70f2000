"""The agent's TOML configuration, its environment overrides, and the errors an operator reads."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from eventspool.agent.config import AgentConfig, load_agent_config
from eventspool.agent.config_loader import ConfigError
from eventspool.config import Durability, FullPolicy, QueueSettings, SenderSettings, SpoolSettings
from eventspool.errors import EventspoolError
from eventspool.routing import Binding, Exchange, ExchangeType

FULL_EXAMPLE = """\
[agent]
spool_dir = "spool"
socket = "agent.sock"
socket_mode = "0660"
max_frame_bytes = 16777216
tcp_listen = "127.0.0.1:7070"
allow_remote = false
http = true

[kafka]
bootstrap_servers = "127.0.0.1:9092"
compression = "zstd"
linger_ms = 10
batch_size = 500000
max_in_flight_per_queue = 1000
metadata_refresh_s = 15
create_topics = false
new_topic_partitions = 8
new_topic_replication = 3

[kafka.config]
"security.protocol" = "PLAINTEXT"
"socket.keepalive.enable" = true

[spool]
max_event_bytes = 500000
sticky_batch_bytes = 8192
queue_bytes = 4194304
durability = "process"
full_policy = "block"
block_timeout_s = 2.5

[topics.orders]
durability = "fsync"

[topics."metrics.cpu"]
queue_bytes = 8388608
full_policy = "drop_oldest"

[quotas]
client_bytes_per_s = 10000000

[quotas.topics]
orders = 5000000
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(textwrap.dedent(text))
    return path


def load_text(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> AgentConfig:
    return load_agent_config(write(tmp_path, text), env={} if env is None else env)


def error_of(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text, env)
    return info.value


# -- what loads ----------------------------------------------------------------------


def test_full_example_round_trip(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL_EXAMPLE)

    default_queue = QueueSettings(
        capacity_bytes=4194304,
        durability=Durability.PROCESS,
        full_policy=FullPolicy.BLOCK,
        block_timeout_s=2.5,
    )
    assert config == AgentConfig(
        spool_dir=tmp_path / "spool",
        socket_path=tmp_path / "agent.sock",
        socket_mode=0o660,
        bootstrap_servers="127.0.0.1:9092",
        max_frame_bytes=16777216,
        tcp_listen="127.0.0.1:7070",
        http=True,
        quota_client_bytes_per_s=10_000_000,
        quota_topic_bytes_per_s={"orders": 5_000_000},
        spool=SpoolSettings(
            max_event_bytes=500_000,
            sticky_batch_bytes=8192,
            queue=default_queue,
            topics={
                # Per-topic tables override only what they name; the rest is [spool]'s.
                "orders": QueueSettings(
                    capacity_bytes=4194304,
                    durability=Durability.FSYNC,
                    full_policy=FullPolicy.BLOCK,
                    block_timeout_s=2.5,
                ),
                "metrics.cpu": QueueSettings(
                    capacity_bytes=8388608,
                    durability=Durability.PROCESS,
                    full_policy=FullPolicy.DROP_OLDEST,
                    block_timeout_s=2.5,
                ),
            },
        ),
        sender=SenderSettings(
            compression="zstd",
            linger_ms=10,
            batch_size=500_000,
            max_in_flight_per_queue=1000,
            metadata_refresh_s=15.0,
            create_topics=False,
            new_topic_partitions=8,
            new_topic_replication=3,
            kafka={"security.protocol": "PLAINTEXT", "socket.keepalive.enable": True},
        ),
    )
    assert isinstance(config.sender.metadata_refresh_s, float)


def test_no_file_gives_the_defaults_under_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_agent_config(None, env={})
    assert config == AgentConfig(
        spool_dir=tmp_path / "spool", socket_path=tmp_path / "spool" / "agent.sock"
    )
    assert config.bootstrap_servers is None
    assert config.tcp_listen is None
    assert config.http is True
    assert config.socket_mode == 0o660
    assert config.spool == SpoolSettings()
    assert config.sender == SenderSettings()


def test_empty_file_gives_the_defaults_under_the_files_folder(tmp_path: Path) -> None:
    config = load_text(tmp_path, "")
    assert config.spool_dir == tmp_path / "spool"
    assert config.socket_path == tmp_path / "spool" / "agent.sock"


def test_relative_paths_are_relative_to_the_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    conf_dir = tmp_path / "etc"
    conf_dir.mkdir()
    config = load_text(conf_dir, '[agent]\nspool_dir = "data/spool"\nsocket = "run/a.sock"\n')
    assert config.spool_dir == conf_dir / "data" / "spool"
    assert config.socket_path == conf_dir / "run" / "a.sock"


def test_absolute_paths_stay_and_the_socket_follows_the_spool_dir(tmp_path: Path) -> None:
    spool_dir = tmp_path / "var" / "spool"
    config = load_text(tmp_path, f"[agent]\nspool_dir = {str(spool_dir)!r}\n")
    assert config.spool_dir == spool_dir
    assert config.socket_path == spool_dir / "agent.sock"


@pytest.mark.parametrize(
    ("written", "mode"),
    [('"0660"', 0o660), ('"600"', 0o600), ('"0o640"', 0o640), ("0o644", 0o644), ("384", 0o600)],
)
def test_socket_mode_as_octal_string_or_integer(tmp_path: Path, written: str, mode: int) -> None:
    assert load_text(tmp_path, f"[agent]\nsocket_mode = {written}\n").socket_mode == mode


@pytest.mark.parametrize("address", ["127.0.0.1:7070", "localhost:1", "[::1]:65535"])
def test_loopback_tcp_listen_needs_no_permission(tmp_path: Path, address: str) -> None:
    assert load_text(tmp_path, f'[agent]\ntcp_listen = "{address}"\n').tcp_listen == address


def test_unquoted_dotted_librdkafka_keys_are_flattened(tmp_path: Path) -> None:
    config = load_text(
        tmp_path,
        '[kafka.config]\nsasl.mechanism = "PLAIN"\nsasl.username = "u"\n"ssl.ca.location" = "ca"\n',
    )
    assert config.sender.kafka == {
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "ssl.ca.location": "ca",
    }


def test_every_sender_field_of_the_brief_is_a_kafka_key(tmp_path: Path) -> None:
    """Guards the derivation of [kafka] keys from SenderSettings against silently losing some."""
    config = load_text(
        tmp_path,
        "[kafka]\nlinger_ms = 1\nbatch_size = 2\nmax_in_flight_per_queue = 3\n"
        "metadata_refresh_s = 4\ncreate_topics = false\nnew_topic_partitions = 5\n"
        'new_topic_replication = 6\ncompression = "gzip"\nretry_backoff_s = 0.5\n',
    )
    assert config.sender == SenderSettings(
        linger_ms=1,
        batch_size=2,
        max_in_flight_per_queue=3,
        metadata_refresh_s=4.0,
        create_topics=False,
        new_topic_partitions=5,
        new_topic_replication=6,
        compression="gzip",
        retry_backoff_s=0.5,
    )


# -- environment overrides -----------------------------------------------------------


def test_environment_overrides_every_kind_of_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    env = {
        "EVENTSPOOL_AGENT_SPOOL_DIR": "from-env",  # path: relative to the current directory
        "EVENTSPOOL_AGENT_SOCKET": "/run/ev.sock",  # path, absolute
        "EVENTSPOOL_AGENT_SOCKET_MODE": "0600",  # octal mode
        "EVENTSPOOL_AGENT_MAX_FRAME_BYTES": " 2000000 ",  # int, spaces tolerated
        "EVENTSPOOL_AGENT_HTTP": "no",  # bool
        "EVENTSPOOL_AGENT_TCP_LISTEN": "127.0.0.2:7070",
        "EVENTSPOOL_AGENT_ALLOW_REMOTE": "YES",
        "EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS": "kafka-1:9092,kafka-2:9092",  # str
        "EVENTSPOOL_KAFKA_METADATA_REFRESH_S": "7.5",  # float
        "EVENTSPOOL_KAFKA_CREATE_TOPICS": "0",
        "EVENTSPOOL_SPOOL_DURABILITY": "fsync",  # enum
        "EVENTSPOOL_SPOOL_QUEUE_BYTES": "8388608",
        "EVENTSPOOL_QUOTAS_CLIENT_BYTES_PER_S": "1000",
        "PATH": "/bin",  # not ours: ignored
        "EVENTSPOOL_CONFIG": "x",  # not under a section prefix: left to others
    }
    config = load_text(tmp_path, FULL_EXAMPLE, env)
    assert config.spool_dir == tmp_path / "from-env"
    assert config.socket_path == Path("/run/ev.sock")
    assert config.socket_mode == 0o600
    assert config.max_frame_bytes == 2_000_000
    assert config.http is False
    assert config.tcp_listen == "127.0.0.2:7070"
    assert config.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert config.sender.metadata_refresh_s == 7.5
    assert config.sender.create_topics is False
    assert config.sender.compression == "zstd"  # the file's value where env is silent
    assert config.spool.queue.durability is Durability.FSYNC
    assert config.spool.queue.capacity_bytes == 8_388_608
    # Topic overrides are layered on the default queue after the environment.
    assert config.spool.for_topic("orders").capacity_bytes == 8_388_608
    assert config.quota_client_bytes_per_s == 1000


def test_environment_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = load_agent_config(None, env={"EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS": "k:9092"})
    assert config.bootstrap_servers == "k:9092"
    assert config.spool_dir == tmp_path / "spool"


def test_empty_variable_means_unset(tmp_path: Path) -> None:
    config = load_text(tmp_path, FULL_EXAMPLE, {"EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS": ""})
    assert config.bootstrap_servers is None


def test_env_defaults_to_os_environ(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTSPOOL_SPOOL_FULL_POLICY", "drop_oldest")
    config = load_agent_config(write(tmp_path, ""))
    assert config.spool.queue.full_policy is FullPolicy.DROP_OLDEST


# -- error messages ------------------------------------------------------------------


def test_config_error_is_an_eventspool_error() -> None:
    assert issubclass(ConfigError, EventspoolError)


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[spool]\ndurabilty = "fsync"\n')
    assert error.key == "spool.durabilty"
    assert "agent.toml" in str(error)
    assert "unknown key spool.durabilty; did you mean spool.durability?" in str(error)


def test_unknown_key_in_a_topic_table(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[topics.orders]\nful_policy = "block"\n')
    assert "topics.orders.ful_policy; did you mean topics.orders.full_policy?" in str(error)


def test_key_in_the_wrong_section_points_to_the_right_one(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[spool]\ncompression = "zstd"\n')
    assert "unknown key spool.compression; did you mean kafka.compression?" in str(error)


def test_unknown_key_without_a_close_one_lists_the_known(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[quotas]\nzzz = 1\n")
    assert "unknown key quotas.zzz (known: client_bytes_per_s, topics)" in str(error)


def test_unknown_section_suggests_the_close_one(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[kafak]\nbootstrap_servers = "k:9092"\n')
    assert "unknown section [kafak]; did you mean [kafka]?" in str(error)


def test_key_above_every_section_points_to_its_section(tmp_path: Path) -> None:
    error = error_of(tmp_path, 'bootstrap_servers = "k:9092"\n')
    assert "did you mean kafka.bootstrap_servers?" in str(error)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[spool]\nqueue_bytes = "32MiB"\n', 'spool.queue_bytes = "32MiB": expected an integer'),
        ("[spool]\nqueue_bytes = 1.5e6\n", "spool.queue_bytes = 1500000.0: expected an integer"),
        ("[agent]\nhttp = 1\n", "agent.http = 1: expected true or false, got an integer"),
        ("[agent]\nmax_frame_bytes = true\n", "agent.max_frame_bytes = true: expected an integer"),
        ('[kafka]\nlinger_ms = "5"\n', 'kafka.linger_ms = "5": expected an integer, got a string'),
        ("[kafka]\nbootstrap_servers = 9092\n", "kafka.bootstrap_servers = 9092: expected a str"),
        ("[kafka]\nconfig = 1\n", "kafka.config = 1: expected a table, got an integer"),
        ("agent = 1\n", "agent = 1: expected a table ([agent]), got an integer"),
        ("[kafka.config]\nx = [1]\n", "kafka.config.x = [1]: expected a string, number or boo"),
        ('[quotas.topics]\norders = "fast"\n', 'quotas.topics.orders = "fast": expected an int'),
        ("[topics]\norders = 1\n", "topics.orders = 1: expected a table of queue settings"),
    ],
)
def test_wrong_type_names_key_value_and_expected_type(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert expected in str(error_of(tmp_path, text))


def test_bad_enum_value_lists_the_allowed_ones(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[spool]\ndurability = "sometimes"\n')
    assert error.key == "spool.durability"
    assert 'spool.durability = "sometimes": must be one of "process", "fsync"' in str(error)
    error = error_of(tmp_path, '[topics.orders]\nfull_policy = "wait"\n')
    assert (
        'topics.orders.full_policy = "wait": must be one of "reject", "block", "drop_oldest"'
        in (str(error))
    )


def test_settings_value_errors_name_our_key(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[spool]\nqueue_bytes = 1000\n")
    assert error.key == "spool.queue_bytes"
    assert "spool.queue_bytes = 1000: must be at least 65536" in str(error)
    error = error_of(tmp_path, '[kafka]\ncompression = "brotli"\n')
    assert 'kafka.compression = "brotli": use lz4, zstd, gzip, snappy or none' in str(error)
    error = error_of(tmp_path, "[topics.orders]\nblock_timeout_s = -1\n")
    assert "topics.orders.block_timeout_s = -1.0: must be finite and not negative" in str(error)
    error = error_of(tmp_path, "[topics.orders]\nblock_timeout_s = inf\n")
    assert "topics.orders.block_timeout_s = inf: must be finite and not negative" in str(error)
    error = error_of(tmp_path, "[agent]\nframe_timeout_s = inf\n")
    assert "agent.frame_timeout_s = inf: must be positive and finite" in str(error)
    error = error_of(tmp_path, "[agent]\nbusy_poll_us = -1\n")
    assert "agent.busy_poll_us = -1.0: must be from 0 to 10000 microseconds" in str(error)
    error = error_of(tmp_path, "[spool]\nsticky_batch_bytes = 0\n")
    assert "spool.sticky_batch_bytes = 0: must be positive" in str(error)


def test_event_size_that_does_not_fit_a_topic_queue(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[topics.small]\nqueue_bytes = 65536\n")
    assert error.key == "spool.max_event_bytes"
    assert "does not fit four times in the queue capacity of topic 'small'" in str(error)


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ('"0680"', 'agent.socket_mode = "0680": expected an octal permission mode like "0660"'),
        ('"rw-rw----"', "expected an octal permission mode"),
        ('"01777"', "must be a permission mode within 0..0777"),
        ("660", "agent.socket_mode = 660: must be a permission mode within 0..0777 (integers"),
        ("6.6", "agent.socket_mode = 6.6: expected an octal string"),
    ],
)
def test_bad_socket_mode(tmp_path: Path, written: str, expected: str) -> None:
    error = error_of(tmp_path, f"[agent]\nsocket_mode = {written}\n")
    assert error.key == "agent.socket_mode"
    assert expected in str(error)


@pytest.mark.parametrize("address", ["0.0.0.0:7070", "10.1.2.3:7070", "[::]:7070", "db:7070"])
@pytest.mark.parametrize("allow_remote", ["", "allow_remote = true\n"])
def test_remote_tcp_listen_without_tls(tmp_path: Path, address: str, allow_remote: str) -> None:
    error = error_of(tmp_path, f'[agent]\ntcp_listen = "{address}"\n{allow_remote}')
    assert error.key == "agent.tcp_listen"
    assert f'agent.tcp_listen = "{address}"' in str(error)
    assert "set tls.cert_file and tls.key_file" in str(error)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("7070", 'expected "host:port"'),
        (":7070", 'expected "host:port"'),
        ("::1:7070", "IPv6 addresses need brackets"),
        ("127.0.0.1:70000", "the port must be within 1..65535"),
    ],
)
def test_malformed_tcp_listen(tmp_path: Path, address: str, expected: str) -> None:
    assert expected in str(error_of(tmp_path, f'[agent]\ntcp_listen = "{address}"\n'))


def test_frame_limit_must_carry_the_largest_event(tmp_path: Path) -> None:
    error = error_of(tmp_path, "[agent]\nmax_frame_bytes = 1000\n")
    assert "agent.max_frame_bytes = 1000: must be at least spool.max_event_bytes" in str(error)
    assert "must be positive" in str(error_of(tmp_path, "[agent]\nmax_frame_bytes = 0\n"))


def test_overlong_socket_path(tmp_path: Path) -> None:
    error = error_of(tmp_path, f'[agent]\nsocket = "{"s" * 200}.sock"\n')
    assert error.key == "agent.socket"
    assert "a unix socket path may have at most" in str(error)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ('"bootstrap.servers" = "k:1"', "set kafka.bootstrap_servers instead"),
        ('"compression.type" = "zstd"', "set kafka.compression instead"),
        ('acks = "1"', "eventspool sets this itself"),
        ('"enable.idempotence" = false', "eventspool sets this itself"),
    ],
)
def test_librdkafka_settings_that_have_a_home_or_are_forced(
    tmp_path: Path, setting: str, expected: str
) -> None:
    assert expected in str(error_of(tmp_path, f"[kafka.config]\n{setting}\n"))


def test_bad_topic_names_and_quotas(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[topics."a b"]\ndurability = "fsync"\n')
    assert error.key == 'topics."a b"'
    assert "contains ' '" in str(error)
    error = error_of(tmp_path, "[quotas.topics]\norders = 0\n")
    assert "quotas.topics.orders = 0: must be positive" in str(error)
    error = error_of(tmp_path, "[quotas]\nclient_bytes_per_s = -5\n")
    assert "quotas.client_bytes_per_s = -5: must be positive" in str(error)


EXCHANGES_EXAMPLE = """\
[exchanges.animals]
type = "topic"
alternate_topic = "animals-unroutable"
bindings = [
  { topic = "q1", key = "*.orange.*" },
  { topic = "q2", key = "*.*.rabbit" },
  { topic = "q2", key = "lazy.#" },
]

[exchanges.everyone]
type = "fanout"

[[exchanges.everyone.bindings]]
topic = "audit"

[[exchanges.everyone.bindings]]
topic = "archive"
"""


def test_exchanges_round_trip(tmp_path: Path) -> None:
    config = load_text(tmp_path, EXCHANGES_EXAMPLE)
    assert config.exchanges == (
        Exchange(
            "animals",
            ExchangeType.TOPIC,
            (Binding("q1", "*.orange.*"), Binding("q2", "*.*.rabbit"), Binding("q2", "lazy.#")),
            "animals-unroutable",
        ),
        Exchange("everyone", ExchangeType.FANOUT, (Binding("audit"), Binding("archive"))),
    )
    assert load_text(tmp_path, "").exchanges == ()


@pytest.mark.parametrize(
    ("text", "key", "expected"),
    [
        ("[exchanges.x]\n", "exchanges.x.type", 'type is missing; use one of "direct", "fanout"'),
        (
            '[exchanges.x]\ntype = "headers"\n',
            "exchanges.x.type",
            'exchanges.x.type = "headers": must be one of "direct", "fanout", "topic"',
        ),
        (
            '[exchanges.x]\ntype = "topic"\nbinding = []\n',
            "exchanges.x.binding",
            "unknown key exchanges.x.binding; did you mean exchanges.x.bindings?",
        ),
        (
            '[exchanges."a b"]\ntype = "topic"\n',
            'exchanges."a b"',
            "exchange name 'a b' contains ' '",
        ),
        ("[exchanges]\nx = 1\n", "exchanges.x", "exchanges.x = 1: expected a table"),
        (
            '[exchanges.x]\ntype = "topic"\nbindings = "q1"\n',
            "exchanges.x.bindings",
            'exchanges.x.bindings = "q1": expected an array like',
        ),
        (
            '[exchanges.x]\ntype = "topic"\nbindings = ["q1"]\n',
            "exchanges.x.bindings[0]",
            'exchanges.x.bindings[0] = "q1": expected a table like',
        ),
        (
            '[exchanges.x]\ntype = "topic"\nbindings = [{key = "a"}]\n',
            "exchanges.x.bindings[0].topic",
            "exchanges.x.bindings[0]: topic is missing or not a string",
        ),
        (
            '[exchanges.x]\ntype = "topic"\nbindings = [{topic = "a/b"}]\n',
            "exchanges.x.bindings[0].topic",
            "topic name 'a/b' contains '/'",
        ),
        (
            '[exchanges.x]\ntype = "topic"\nbindings = [{topic = "t", keys = "a"}]\n',
            "exchanges.x.bindings[0].keys",
            "unknown key exchanges.x.bindings[0].keys (known: key, topic)",
        ),
        (
            '[exchanges.x]\ntype = "topic"\nbindings = [{topic = "t", key = 1}]\n',
            "exchanges.x.bindings[0].key",
            "exchanges.x.bindings[0].key = 1: expected a string, got an integer",
        ),
        (
            '[exchanges.x]\ntype = "fanout"\nbindings = [{topic = "t", key = "k"}]\n',
            "exchanges.x",
            "a fanout exchange ignores keys",
        ),
        (
            '[exchanges.x]\ntype = "direct"\nalternate_topic = 5\n',
            "exchanges.x.alternate_topic",
            "exchanges.x.alternate_topic = 5: expected a topic name, got an integer",
        ),
        (
            '[exchanges.x]\ntype = "direct"\nalternate_topic = "no way"\n',
            "exchanges.x.alternate_topic",
            "topic name 'no way' contains ' '",
        ),
    ],
)
def test_bad_exchanges_name_the_key(tmp_path: Path, text: str, key: str, expected: str) -> None:
    error = error_of(tmp_path, text)
    assert error.key == key
    assert expected in str(error)
    assert "agent.toml" in str(error)


def test_empty_bootstrap_servers_in_the_file(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[kafka]\nbootstrap_servers = ""\n')
    assert "leave it out to run without a sender" in str(error)


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("EVENTSPOOL_AGENT_MAX_FRAME_BYTES", "16MiB", "an integer for agent.max_frame_bytes"),
        ("EVENTSPOOL_KAFKA_METADATA_REFRESH_S", "soon", "a number for kafka.metadata_refresh_s"),
        ("EVENTSPOOL_AGENT_HTTP", "maybe", "true/false, 1/0 or yes/no for agent.http"),
    ],
)
def test_environment_value_that_does_not_parse(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    error = error_of(tmp_path, "", {variable: value})
    assert f'{variable} = "{value}": expected {expected}' in str(error)


def test_invalid_environment_value_names_the_variable(tmp_path: Path) -> None:
    error = error_of(tmp_path, FULL_EXAMPLE, {"EVENTSPOOL_SPOOL_DURABILITY": "sometimes"})
    assert error.key == "spool.durability"
    assert 'EVENTSPOOL_SPOOL_DURABILITY (spool.durability) = "sometimes": must be one of' in str(
        error
    )
    error = error_of(tmp_path, "", {"EVENTSPOOL_AGENT_SOCKET_MODE": "999"})
    assert "EVENTSPOOL_AGENT_SOCKET_MODE (agent.socket_mode)" in str(error)


def test_unknown_environment_variable_under_a_section_prefix(tmp_path: Path) -> None:
    error = error_of(tmp_path, "", {"EVENTSPOOL_SPOOL_DURABILTY": "fsync"})
    assert "unknown environment variable EVENTSPOOL_SPOOL_DURABILTY" in str(error)
    assert "did you mean EVENTSPOOL_SPOOL_DURABILITY?" in str(error)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    error = error_of(tmp_path, '[agent]\nhttp = true\nsocket = "unterminated\n')
    assert str(error).startswith(f"{tmp_path / 'agent.toml'}:3:")
    assert "invalid TOML" in str(error)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml: cannot read the configuration"):
        load_agent_config(tmp_path / "missing.toml", env={})


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_bytes(b'[agent]\nsocket = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_agent_config(path, env={})
