"""`eventspool tail` and `eventspool topics`: what was sent, read back without a group.

Against the embedded broker (whose high watermark lags: ends come from the exact probe)
and the 3-broker mock cluster.
"""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest
from click.testing import CliRunner, Result
from confluent_kafka import Producer

from eventspool import Spool
from eventspool.broker import LocalBroker
from eventspool.broker.mock import MockCluster
from eventspool.cli import main
from eventspool.tail import Record, compile_format, first_offset, parse_start, record_json

# What the spool sends: (key, value, headers); a tombstone, bytes that are not UTF-8, and a
# header without a value among them.
EVENTS: list[tuple[bytes | None, bytes | None, dict[str, bytes | None]]] = [
    (b"user-1", b'{"amount": 42}', {"source": b"cli", "trace": b"t-1"}),
    (b"user-2", b"\xff\xfe binary", {"blob": b"\x80\x81", "empty": None}),
    (None, b"no key", {}),
    (b"user-1", None, {"source": b"gc"}),
]


def _tail(*args: str) -> Result:
    """`eventspool tail` in this process, with no address found in the environment."""
    return CliRunner().invoke(main, ["tail", *args], env={"EVENTSPOOL_BOOTSTRAP_SERVERS": None})


def _spool_events(tmp_path: Path, bootstrap: str, topic: str) -> list[str]:
    """Send EVENTS through a spool, all acknowledged; their event ids, in order."""
    with Spool(tmp_path / "spool", bootstrap) as spool:
        ids = [spool.send(topic, value, key=key, headers=headers) for key, value, headers in EVENTS]
        assert spool.flush(timeout=30) == 0
    return ids


def _produce(bootstrap: str, topic: str, values: list[bytes], partition: int) -> None:
    """Records that leave in one batch, so the embedded broker's watermark lags behind."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 200})
    for value in values:
        producer.produce(topic, value, partition=partition)
    assert producer.flush(30) == 0


def test_tail_prints_what_the_spool_sent_then_stops(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    ids = _spool_events(tmp_path, broker.bootstrap_servers, topic)
    result = _tail(topic, "--bootstrap-servers", broker.bootstrap_servers)
    assert result.exit_code == 0, result.output
    lines = result.stdout_bytes.split(b"\n")
    assert lines.pop() == b""
    assert len(lines) == len(EVENTS)
    for offset, (line, event_id, (key, value, headers)) in enumerate(
        zip(lines, ids, EVENTS, strict=True)
    ):
        shown = [b"event_id=" + event_id.encode()]  # the spool's header comes first
        shown += [name.encode() + b"=" + (v or b"") for name, v in headers.items()]
        expected = b"%s/0@%d key=%s headers=%s value=%s" % (
            topic.encode(),
            offset,
            key or b"",
            b",".join(shown),
            value or b"",
        )
        assert line == expected


def test_tail_json_gives_text_base64_and_nulls_as_the_http_interface(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    topic = topic_factory(1)
    ids = _spool_events(tmp_path, broker.bootstrap_servers, topic)
    result = _tail(topic, "--bootstrap-servers", broker.bootstrap_servers, "--json")
    assert result.exit_code == 0, result.output
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(d["topic"], d["partition"], d["offset"]) for d in documents] == [
        (topic, 0, offset) for offset in range(len(EVENTS))
    ]
    assert all(isinstance(d["timestamp"], int) for d in documents)
    first, binary, keyless, tombstone = documents
    assert (first["key"], first["value"]) == ("user-1", '{"amount": 42}')
    assert first["headers"] == {"source": "cli", "trace": "t-1", "event_id": ids[0]}
    assert binary["key"] == "user-2"
    assert base64.b64decode(binary["value_b64"]) == b"\xff\xfe binary"
    assert "value" not in binary
    assert binary["headers"] == {"empty": None, "event_id": ids[1]}
    assert binary["headers_b64"] == {"blob": base64.b64encode(b"\x80\x81").decode()}
    assert (keyless["key"], keyless["value"]) == (None, "no key")
    assert (tombstone["key"], tombstone["value"]) == ("user-1", None)
    assert tombstone["headers"] == {"source": "gc", "event_id": ids[3]}


def test_tail_stops_at_exact_ends_and_after_count(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Ten records in one batch read as one by the watermark; tail shows all ten, the
    last two with -o -2, none from the end, and stops after --count."""
    topic = topic_factory(2)
    values = [b"r%d" % i for i in range(10)]
    _produce(broker.bootstrap_servers, topic, values, partition=1)
    servers = ["--bootstrap-servers", broker.bootstrap_servers]

    def shown(*args: str) -> list[str]:
        result = _tail(topic, *servers, "--format", r"%p:%o:%s\n", *args)
        assert result.exit_code == 0, result.output
        return result.stdout.splitlines()

    assert shown() == [f"1:{i}:r{i}" for i in range(10)]
    assert shown("-o", "-2") == ["1:8:r8", "1:9:r9"]
    assert shown("-o", "7", "--count", "1") == ["1:7:r7"]
    assert shown("--count", "3") == ["1:0:r0", "1:1:r1", "1:2:r2"]
    assert shown("-o", "end") == []


def _collect(stream: IO[str], lines: list[str]) -> None:
    lines.extend(line.rstrip("\n") for line in iter(stream.readline, ""))


# Runs the rest of its arguments with SIGINT at its default, so that Python makes it a
# KeyboardInterrupt: a suite started in the background by a shell (`make test &`)
# inherits SIGINT ignored, and Python then leaves it ignored, as it should.
CTRL_C_LIVE = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_tail_from_the_end_follows_only_new_records_until_ctrl_c(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    _produce(broker.bootstrap_servers, topic, [b"old-%d" % i for i in range(10)], partition=0)
    follower = subprocess.Popen(
        [
            *(sys.executable, "-c", CTRL_C_LIVE, "-X", "faulthandler", "-m", "eventspool"),
            *("tail", topic, "-o", "end", "--follow"),
            *("--bootstrap-servers", broker.bootstrap_servers, "--format", r"%p %o %s\n"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        seen: list[str] = []
        reader = threading.Thread(target=_collect, args=(follower.stdout, seen))
        reader.start()
        # The follower starts at the ends it finds: keep adding new records until it
        # shows some, since it may find the ends after the first of them.
        deadline = time.monotonic() + 60
        sent = 0
        while not seen and time.monotonic() < deadline:
            _produce(broker.bootstrap_servers, topic, [b"new-%d" % sent], partition=sent % 2)
            sent += 1
            time.sleep(0.5)
        time.sleep(1.0)
        follower.send_signal(signal.SIGINT)
        try:
            assert follower.wait(timeout=20) == 0, follower.stderr.read() if follower.stderr else ""
        except subprocess.TimeoutExpired:
            # faulthandler's dump on SIGABRT says where it waits.
            follower.send_signal(signal.SIGABRT)
            follower.wait(timeout=10)
            stderr = follower.stderr.read() if follower.stderr else ""
            pytest.fail(f"tail --follow did not end within 20 s of SIGINT:\n{stderr}")
        reader.join(timeout=10)
    finally:
        follower.kill()
        follower.wait()
    assert seen, "the follower showed none of the new records"
    values = [line.split(" ")[2] for line in seen]
    assert all(value.startswith("new-") for value in values), seen
    first = int(values[0].removeprefix("new-"))
    assert sorted(values, key=lambda v: int(v.removeprefix("new-"))) == [
        f"new-{i}" for i in range(first, sent)
    ]
    partition_0 = [int(line.split(" ")[1]) for line in seen if line.startswith("0 ")]
    assert all(offset >= 10 for offset in partition_0)


def test_tail_of_a_missing_topic_fails_at_once(broker: LocalBroker) -> None:
    started = time.monotonic()
    result = _tail("no-such-topic-here", "--bootstrap-servers", broker.bootstrap_servers)
    assert result.exit_code == 1
    assert "topic 'no-such-topic-here' does not exist" in result.output
    assert time.monotonic() - started < 10
    listed = CliRunner().invoke(main, ["topics", "--bootstrap-servers", broker.bootstrap_servers])
    assert "no-such-topic-here" not in listed.stdout  # the look did not create it


def test_topics_lists_partitions_and_exact_ends(
    broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(3)
    _produce(broker.bootstrap_servers, topic, [b"a"] * 10, partition=0)
    _produce(broker.bootstrap_servers, topic, [b"b"] * 4, partition=2)
    servers = ["--bootstrap-servers", broker.bootstrap_servers]
    result = CliRunner().invoke(main, ["topics", *servers])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITIONS", "END"]
    assert [line.split() for line in lines if line.startswith(topic)] == [[topic, "3", "14"]]
    assert not any(line.startswith("__") for line in lines)
    by_partition = CliRunner().invoke(main, ["topics", "--partitions", *servers])
    assert by_partition.exit_code == 0, by_partition.output
    rows = [line.split() for line in by_partition.stdout.splitlines() if line.startswith(topic)]
    assert rows == [[topic, "0", "10"], [topic, "1", "0"], [topic, "2", "4"]]


def _produce_with_headers(bootstrap: str, topic: str) -> dict[str, tuple[str, str, int]]:
    """30 keyed records over 3 partitions, each with headers; by event id: key, value,
    partition. The producer is gone on return, before the cluster stops under it."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    sent: dict[str, tuple[str, str, int]] = {}
    for index in range(30):
        event_id = f"id-{index}"
        producer.produce(
            topic,
            f"value-{index}".encode(),
            key=f"user-{index % 5}".encode(),
            partition=index % 3,
            headers=[("event_id", event_id.encode()), ("n", str(index).encode())],
        )
        sent[event_id] = (f"user-{index % 5}", f"value-{index}", index % 3)
    assert producer.flush(30) == 0
    return sent


def test_tail_reads_back_what_was_produced_to_the_mock_cluster(cluster: MockCluster) -> None:
    cluster.create_topic("orders", 3, 3)
    sent = _produce_with_headers(cluster.bootstrap_servers, "orders")
    result = _tail("orders", "--bootstrap-servers", cluster.bootstrap_servers, "--json")
    assert result.exit_code == 0, result.output
    documents = [json.loads(line) for line in result.stdout.splitlines()]
    read = {d["headers"]["event_id"]: (d["key"], d["value"], d["partition"]) for d in documents}
    assert read == sent
    assert len(documents) == len(sent)
    assert all(d["headers"]["n"] == d["headers"]["event_id"][3:] for d in documents)


RECORD = Record(
    "t", 2, 17, 1_700_000_000_000, b"k\xff", None, (("a", b"1"), ("b", None), ("a", b"\x80"))
)


def test_format_tokens_escapes_and_errors() -> None:
    render = compile_format(r"%t|%p|%o|%T|%k|%s|%K|%S|%h|%%\t\\\n")
    assert render(RECORD) == b"t|2|17|1700000000000|k\xff||2|-1|a=1,b=,a=\x80|%\t\\\n"
    for bad in ("%x", "%", r"\q", "\\"):
        with pytest.raises(ValueError, match="not a token"):
            compile_format(bad)


def test_json_of_a_record_with_bytes_and_a_repeated_header() -> None:
    assert record_json(RECORD) == {
        "topic": "t",
        "partition": 2,
        "offset": 17,
        "timestamp": 1_700_000_000_000,
        "key_b64": base64.b64encode(b"k\xff").decode(),
        "value": None,
        "headers": {"b": None},
        "headers_b64": {"a": base64.b64encode(b"\x80").decode()},
    }


def test_start_offsets_are_clamped_to_what_the_partition_holds() -> None:
    assert [parse_start(text) for text in ("beginning", "end", "5", "-3")] == [
        "beginning",
        "end",
        5,
        -3,
    ]
    with pytest.raises(ValueError, match="expected beginning, end, N or -N"):
        parse_start("latest")
    assert first_offset("beginning", 4, 10) == 4
    assert first_offset("end", 4, 10) == 10
    assert [first_offset(n, 4, 10) for n in (0, 6, 99, -3, -99)] == [4, 6, 10, 7, 4]
