"""The agent as a real process: socket, clients, errors, ownership, permissions."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from eventspool import EventTooLargeError, InvalidTopicError
from eventspool.broker import LocalBroker, find_free_port
from eventspool.cli import main
from eventspool.client.sync import AgentError, Client
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids, ledger
from eventspool.wire.protocol import (
    Frame,
    FrameDecoder,
    FrameType,
    Status,
    WireEvent,
    decode_error,
    decode_send_result,
    encode_frame,
    encode_send,
)
from tests.agent.conftest import AgentFactory, call
from tests.wire_support import read_frames


def test_events_sent_through_the_agent_reach_kafka(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(3)
    agent = agent_factory()
    agent.start()
    ids: list[str] = []
    lock = threading.Lock()
    with Client(agent.socket_path) as client:
        assert client.ping() < 1.0

        def produce(worker: int) -> None:
            for i in range(300):
                event_id = client.send(topic, b"payload %d" % i, key=f"user-{worker}-{i % 7}")
                with lock:
                    ids.append(event_id)

        threads = [threading.Thread(target=produce, args=(w,)) for w in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(set(ids)) == 2400
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60)
    assert ledger(ids, seen).lost == 0


def test_bad_events_get_their_own_status_and_others_pass(agent_factory: AgentFactory) -> None:
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as client:
        with pytest.raises(InvalidTopicError, match="contains"):
            client.send("no spaces allowed", b"x")
        with pytest.raises(EventTooLargeError, match="over the maximum"):
            client.send("fine", b"x" * 200_000)
        assert len(client.send("fine", b"still works")) == 36


def test_the_callers_event_id_reaches_kafka_and_a_bad_one_fails_alone(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """A retry with the same id is a second record under that id, which verify counts as a
    duplicate; a malformed id sent past the client's checks is refused event by event."""
    topic = topic_factory(1)
    chosen = str(uuid.uuid4())
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as client:
        assert client.send(topic, b"first try", b"k", event_id=chosen) == chosen
        assert client.send_many(topic, [(b"retry", b"k", None, chosen.upper())]) == [chosen]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
        raw.connect(str(agent.socket_path))
        raw.settimeout(10)
        events = [
            WireEvent(b"bad id", event_id="z" * 36),
            WireEvent(b"own header", headers=[("event_id", chosen.encode())]),
            WireEvent(b"fine", event_id=str(uuid.uuid4())),
        ]
        raw.sendall(encode_send(5, topic, events))
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while not frames:
            frames = decoder.feed(raw.recv(65536))
    bad_id, own_header, fine = decode_send_result(frames[0].body)
    assert (bad_id.status, own_header.status) == (Status.MALFORMED, Status.MALFORMED)
    assert "not a UUID" in bad_id.text
    assert "event_id=" in own_header.text
    assert fine.ok
    assert fine.text == events[2].event_id
    seen = consume_event_ids(broker.bootstrap_servers, [topic], [chosen, fine.text], to_end=True)
    assert seen == {chosen: 2, fine.text: 1}
    assert ledger([chosen, fine.text], seen).duplicated == 1


def test_a_malformed_frame_closes_only_that_connection(agent_factory: AgentFactory) -> None:
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as healthy:
        healthy.send("fine", b"before")
        bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bad.connect(str(agent.socket_path))
        bad.sendall(b"\xff\xff\xff\xff garbage that claims to be 4 GiB")
        bad.settimeout(5)
        reply = b""
        while chunk := bad.recv(4096):
            reply += chunk
        frames = FrameDecoder().feed(reply)
        assert [f.type for f in frames] == [FrameType.ERROR]
        assert decode_error(frames[0].body).status is Status.MALFORMED
        bad.close()
        healthy.send("fine", b"after")
    assert agent.process is not None
    assert agent.process.poll() is None


def test_a_unix_connection_keeps_its_order_when_the_server_takes_it_over(
    agent_factory: AgentFactory,
) -> None:
    """The compiled listener answers SENDs and PINGs; at a STATS it hands the connection,
    with the answers it did not write yet, to the server, which answers the rest of the
    read and everything after it in order. STATS counts the connections of both."""
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as other:
        other.send("fine", b"stays with the listener")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(agent.socket_path))
            sock.settimeout(10)
            sock.sendall(
                encode_send(1, "fine", [WireEvent(b"a")])
                + encode_send(2, "fine", [WireEvent(b"b")])
                + encode_frame(FrameType.STATS, 3, b"")
                + encode_send(4, "fine", [WireEvent(b"c")])
                + encode_frame(FrameType.PING, 5, b"ping")
            )
            frames = read_frames(sock, 5)
            sock.sendall(encode_send(6, "fine", [WireEvent(b"d")]))
            frames += read_frames(sock, 1)
        assert [(f.type, f.request_id) for f in frames] == [
            (FrameType.SEND_RESULT, 1),
            (FrameType.SEND_RESULT, 2),
            (FrameType.STATS_RESULT, 3),
            (FrameType.SEND_RESULT, 4),
            (FrameType.PONG, 5),
            (FrameType.SEND_RESULT, 6),
        ]
        ids = [decode_send_result(f.body)[0] for f in frames if f.type is FrameType.SEND_RESULT]
        assert all(result.ok for result in ids) and len({r.text for r in ids}) == 4
        assert json.loads(frames[2].body)["connections"] == 2
        other.send("fine", b"still answered")


def test_a_second_agent_on_the_same_spool_exits_with_a_clear_message(
    agent_factory: AgentFactory, tmp_path: Path
) -> None:
    first = agent_factory()
    first.start()
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = agent_factory(directory=second_dir)
    second.config.write_text(
        first.config.read_text().replace('"spool"', f'"{tmp_path / "spool"}"', 1)
    )
    process = second.start(wait=False)
    assert process.wait(30) != 0
    output = second.log.read_text()
    assert "another agent is running" in output
    assert "already owned" in output


def _connects_as_nobody(path: Path) -> bool:
    """Whether an unprivileged user can connect to the socket at `path` (forks, needs root)."""
    child = os.fork()
    if child == 0:
        code = 2
        try:
            os.setgid(65534)
            os.setuid(65534)
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
                code = 0
            except PermissionError:
                code = 1
        finally:
            os._exit(code)
    _, status = os.waitpid(child, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), f"probe failed with {code}"
    return code == 0


def test_socket_mode_is_as_configured_and_others_are_refused(agent_factory: AgentFactory) -> None:
    shared = Path(tempfile.mkdtemp(prefix="eventspool-sock-"))
    shared.chmod(0o755)
    try:
        agent = agent_factory('socket_mode = "0600"', socket_path=shared / "agent.sock")
        agent.start()
        assert stat.S_IMODE(agent.socket_path.stat().st_mode) == 0o600
        if os.geteuid() != 0:
            pytest.skip("needs root to connect as another user")
        assert not _connects_as_nobody(agent.socket_path)
        agent.socket_path.chmod(0o666)  # the control: the mode alone made the difference
        assert _connects_as_nobody(agent.socket_path)
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_client_reports_an_unreachable_agent(tmp_path: Path) -> None:
    with (
        Client(tmp_path / "nobody.sock", timeout=0.3) as client,
        pytest.raises(AgentError, match="cannot connect"),
    ):
        client.send("topic", b"x")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readme_curl_example_works(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """The README's `curl --unix-socket` lines, run as written (socket path substituted)."""
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start()
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    commands = [
        line.strip()
        for line in readme.splitlines()
        if line.strip().startswith("curl --unix-socket")
    ]
    assert len(commands) >= 3, "the README lost its curl examples"
    outputs = []
    for written in commands:
        command = written.replace("/run/eventspool/agent.sock", str(agent.socket_path))
        command = command.replace("/v1/topics/orders", f"/v1/topics/{topic}")
        done = subprocess.run(
            command, shell=True, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    sent = [
        result["event_id"]
        for output in outputs
        if output.startswith("{") and '"results"' in output
        for result in json.loads(output)["results"]
    ]
    assert len(sent) >= 2
    assert ledger(sent, consume_event_ids(broker.bootstrap_servers, [topic], sent)).lost == 0
    assert any("eventspool_queue_depth" in output for output in outputs)
    assert any('"status": "ok"' in output for output in outputs)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_http_rejects_bad_bodies_with_clear_errors(agent_factory: AgentFactory) -> None:
    agent = agent_factory()
    agent.start()

    def post(body: str) -> tuple[int, dict[str, Any]]:
        done = subprocess.run(
            [
                "curl",
                "-s",
                "-o",
                "-",
                "-w",
                "\\n%{http_code}",
                "--unix-socket",
                str(agent.socket_path),
                "-X",
                "POST",
                "--data-binary",
                body,
                "http://agent/v1/topics/fine",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        text, code = done.stdout.rsplit("\n", 1)
        return int(code), json.loads(text)

    assert post("not json")[0] == 400
    code, answer = post('{"value": "x", "colour": "red"}')
    assert code == 400
    assert "colour" in str(answer["error"])
    code, answer = post('{"events": [{"value": "ok"}, {"value_b64": "!!"}]}')
    assert code == 400
    assert "base64" in str(answer["error"])
    code, answer = post('{"events": [{"value": "a", "key": "k"}, {"value": null, "key": "k"}]}')
    assert code == 200
    assert [r["status"] for r in answer["results"]] == ["ok", "ok"]
    chosen = str(uuid.uuid4())
    code, answer = post(json.dumps({"value": "retried", "event_id": chosen}))
    assert (code, answer["results"][0]["event_id"]) == (200, chosen)
    code, answer = post('{"value": "x", "event_id": "order-17"}')
    assert code == 400
    assert "not a UUID" in str(answer)
    code, answer = post('{"value": "x", "event_id": 17}')
    assert code == 400
    assert "event_id must be a string" in str(answer["error"])
    code, answer = post('{"value": "x", "headers": {"event_id": "mine"}}')
    assert code == 400
    assert '"event_id" field of an HTTP' in str(answer)


def test_an_agent_without_bootstrap_servers_says_it_only_spools(tmp_path: Path) -> None:
    agent = AgentProcess(tmp_path, None)
    try:
        agent.start()
        status, health = call(agent, "GET", "/healthz")
    finally:
        agent.stop()
    assert status == 200
    assert health["status"] == "spool_only"
    assert "never sent to Kafka" in health["reason"]


def test_status_shows_each_queue_and_the_broker(agent_factory: AgentFactory) -> None:
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as client:
        for i in range(50):
            client.send("status-topic", b"x", key=f"k{i}")
        deadline = time.monotonic() + 30
        while not client.stats()["broker_connected"]:  # the first metadata answer
            assert time.monotonic() < deadline, "the agent never reached the broker"
            time.sleep(0.1)
    result = CliRunner().invoke(main, ["status", "--socket", str(agent.socket_path), "--once"])
    assert result.exit_code == 0, result.output
    assert "status-topic/" in result.output
    assert "DEPTH" in result.output
    assert "broker: connected" in result.output


def test_status_of_a_missing_agent_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status", "--socket", str(tmp_path / "x.sock"), "--once"])
    assert result.exit_code != 0
    assert "cannot connect" in result.output


def test_adopt_drains_the_spool_of_a_killed_producer(
    agent_factory: AgentFactory, broker: LocalBroker, tmp_path: Path
) -> None:
    orphan = tmp_path / "orphan"
    script = (
        "import os, signal, sys\n"
        "from eventspool import Spool\n"
        f"spool = Spool({str(orphan)!r})\n"
        "ids = [spool.send('adopted-topic', b'left %d' % i, key=str(i)) for i in range(300)]\n"
        "sys.stdout.write('\\n'.join(ids)); sys.stdout.flush()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    ids = done.stdout.split()
    assert len(ids) == 300
    agent = agent_factory()
    agent.start(extra_args=["--adopt", str(orphan)])
    seen = consume_event_ids(broker.bootstrap_servers, ["adopted-topic"], ids, timeout=60)
    assert ledger(ids, seen).lost == 0
    deadline = time.monotonic() + 30
    while "every event was delivered" not in agent.log.read_text():
        assert time.monotonic() < deadline, agent.log.read_text()
        time.sleep(0.1)


def test_a_client_over_its_quota_is_delayed_not_refused(agent_factory: AgentFactory) -> None:
    agent = agent_factory("[quotas]\nclient_bytes_per_s = 100000")
    agent.start()
    with Client(agent.socket_path) as client:
        started = time.monotonic()
        for _ in range(30):
            client.send("quota-topic", b"q" * 10_000)
        elapsed = time.monotonic() - started
        stats = client.stats()
    assert elapsed > 1.5, "300 kB at 100 kB/s over an 11 s window must be slowed down"
    assert stats["throttle_seconds"] > 1.0


def test_tcp_listener_when_configured(agent_factory: AgentFactory) -> None:
    port = find_free_port()
    agent = agent_factory(f'tcp_listen = "127.0.0.1:{port}"')
    agent.start()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(encode_send(7, "tcp-topic", [WireEvent(b"over tcp")]))
        decoder = FrameDecoder()
        frames: list[Frame] = []
        while not frames:
            frames = decoder.feed(conn.recv(65536))
    assert frames[0].request_id == 7
    results = decode_send_result(frames[0].body)
    assert results[0].ok
