"""TCP only with TLS: the listener refuses what is not TLS, a client without a trusted
certificate or a known token, and grants what the rules of a certificate's name or a
token grant; a listener other hosts can reach does not start without TLS.

Certificates are made at test time with the openssl command (eventspool.testing.tls);
the agent is a real process on real sockets, as in the other agent tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool.agent.access import Peer, PeerRule, PeerRules, token_digest
from eventspool.agent.config import load_agent_config
from eventspool.agent.config_loader import ConfigError
from eventspool.broker import LocalBroker
from eventspool.broker.local import find_free_port
from eventspool.client.aio import AsyncClient
from eventspool.client.sync import AgentError, Client
from eventspool.errors import ForbiddenError
from eventspool.testing.agent import AgentProcess
from eventspool.testing.tls import Pki, have_openssl
from eventspool.verify import consume_event_ids, ledger
from eventspool.wire.protocol import (
    FrameDecoder,
    FrameType,
    Status,
    WireEvent,
    decode_error,
    encode_frame,
    encode_send,
)
from tests.agent.conftest import AgentFactory, call
from tests.agent.test_peer_rules import assert_grant_is_the_union

pytestmark = pytest.mark.skipif(not have_openssl(), reason="certificates are made with openssl")

TOKEN = "billing-token-5f0c2e9a41d7b836"
WRONG_TOKEN = "billing-token-0000000000000000"


@dataclass(frozen=True)
class Certs:
    pki: Pki
    server: tuple[Path, Path]
    billing: tuple[Path, Path]  # the name a rule grants
    intruder: tuple[Path, Path]  # signed by the same CA, named by no rule
    stranger: tuple[Path, Path]  # named "billing", signed by another CA


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    directory = tmp_path_factory.mktemp("pki")
    pki = Pki(directory / "ca")
    other = Pki(directory / "other-ca", name="another-ca")
    return Certs(
        pki,
        pki.issue("localhost", server=True),
        pki.issue("billing"),
        pki.issue("intruder"),
        other.issue("billing"),
    )


def tls_agent(
    agent_factory: AgentFactory, certs: Certs, rules: str = "", *, client_ca: bool = False
) -> tuple[AgentProcess, str]:
    """A started agent with a TLS listener on a loopback port; (agent, "tcp://...")."""
    port = find_free_port()
    cert, key = certs.server
    ca = f'client_ca_file = "{certs.pki.ca_cert}"\n' if client_ca else ""
    agent = agent_factory(
        f'tcp_listen = "127.0.0.1:{port}"\n'
        f'[tls]\ncert_file = "{cert}"\nkey_file = "{key}"\n{ca}{rules}'
    )
    agent.start()
    return agent, f"tcp://127.0.0.1:{port}"


def tcp_socket(target: str, timeout: float = 10.0) -> socket.socket:
    """A TCP connection to the agent, retried while its listener is not up yet."""
    host, _, port = target.removeprefix("tcp://").rpartition(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=timeout)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def topics_on_disk(agent: AgentProcess) -> list[str]:
    topics = agent.directory / "spool" / "topics"
    return sorted(p.name for p in topics.iterdir()) if topics.exists() else []


def test_a_plaintext_client_is_refused_by_a_tls_listener(
    agent_factory: AgentFactory, certs: Certs
) -> None:
    agent, target = tls_agent(agent_factory, certs)
    with Client(target, timeout=5) as client, pytest.raises(AgentError, match="without TLS"):
        client.send("plain", b"in clear")
    with tcp_socket(target) as raw:
        raw.sendall(encode_send(1, "plain", [WireEvent(b"in clear")]))
        assert read_until_closed(raw) == b""  # no frame: the handshake failed
    stats = agent.stats()
    assert stats["tls_handshake_failures"] == 2
    assert "eventspool_tls_handshake_failures_total 2.0" in call(agent, "GET", "/metrics")[1]
    assert "plain" not in topics_on_disk(agent)
    log = agent.log_tail()
    assert log.count("a client without TLS?") == 1, "logged once per client host and reason"


def test_under_mutual_tls_a_client_without_a_trusted_certificate_is_refused(
    agent_factory: AgentFactory, certs: Certs
) -> None:
    agent, target = tls_agent(agent_factory, certs, client_ca=True)
    for cert in (None, certs.stranger):
        context = certs.pki.client_context(cert)
        with (
            Client(target, timeout=5, ssl_context=context) as client,
            pytest.raises(AgentError, match="closed the connection at once"),
        ):
            client.send("mtls", b"refused")
    assert agent.stats()["tls_handshake_failures"] == 2
    assert "mtls" not in topics_on_disk(agent)
    log = agent.log_tail()
    assert "peer did not return a certificate" in log
    assert "certificate verify failed" in log or "unknown ca" in log


def test_a_certificate_is_served_what_its_name_is_granted(
    agent_factory: AgentFactory,
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    certs: Certs,
) -> None:
    granted = topic_factory(1)
    agent, target = tls_agent(
        agent_factory,
        certs,
        f'[[access]]\nname = "billing"\ncert_cns = ["billing"]\ntopics = ["{granted}"]\n',
        client_ca=True,
    )
    with Client(target, ssl_context=certs.pki.client_context(certs.billing)) as client:
        event_id = client.send(granted, b"over mutual TLS")
        with pytest.raises(ForbiddenError, match=r"certificate CN 'billing'.*rules: billing"):
            client.send("secret", b"not granted")
    with (
        Client(target, ssl_context=certs.pki.client_context(certs.intruder)) as intruder,
        pytest.raises(ForbiddenError, match=r"no \[\[access\]\] rule matches it"),
    ):
        intruder.send(granted, b"a trusted certificate, but named by no rule")
    stats = agent.stats()
    assert stats["forbidden_by_rule"] == {"billing": 1, "(none)": 1}
    assert stats["tls_handshake_failures"] == 0
    assert topics_on_disk(agent) == [granted]
    seen = consume_event_ids(broker.bootstrap_servers, [granted], [event_id], timeout=60)
    assert ledger([event_id], seen).lost == 0


def test_a_token_is_served_what_its_rule_grants_and_a_wrong_one_is_refused(
    agent_factory: AgentFactory,
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    certs: Certs,
) -> None:
    granted = topic_factory(1)
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    agent, target = tls_agent(
        agent_factory,
        certs,
        f'[[access]]\nname = "billing"\ntoken_sha256 = ["{digest}"]\ntopics = ["{granted}"]\n',
    )
    context = certs.pki.client_context()
    with Client(target, ssl_context=context, token=TOKEN) as client:
        event_id = client.send(granted, b"with a token")
        with pytest.raises(ForbiddenError, match="rules: billing"):
            client.send("secret", b"not granted")
    for token, refusal in [(WRONG_TOKEN, "no such token"), (None, "takes a token first")]:
        with (
            Client(target, timeout=5, ssl_context=context, token=token) as client,
            pytest.raises(ForbiddenError, match=refusal),
        ):
            client.send(granted, b"refused")

    async def send_async() -> str:
        async with AsyncClient(target, ssl_context=context, token=WRONG_TOKEN) as refused:
            with pytest.raises(ForbiddenError, match="no such token"):
                await refused.send(granted, b"refused, from asyncio")
        async with AsyncClient(target, ssl_context=context, token=TOKEN) as client:
            return await client.send(granted, b"with a token, from asyncio")

    async_id = asyncio.run(send_async())

    with context.wrap_socket(tcp_socket(target), server_hostname="127.0.0.1") as raw:
        raw.sendall(encode_frame(FrameType.PING, 7, b"") + encode_frame(FrameType.AUTH, 8, b"x"))
        answers = FrameDecoder().feed(read_until_closed(raw))
    assert [(frame.type, frame.request_id) for frame in answers] == [(FrameType.ERROR, 7)]
    assert decode_error(answers[0].body).status is Status.FORBIDDEN

    stats = agent.stats()
    assert stats["auth_failures"] == 4
    assert "eventspool_auth_failures_total 4.0" in call(agent, "GET", "/metrics")[1]
    assert stats["forbidden_by_rule"] == {"billing": 1}
    log = agent.log_tail()
    assert log.count("unknown token") == 1 and log.count("no token") == 1
    assert topics_on_disk(agent) == [granted]
    sent = [event_id, async_id]
    seen = consume_event_ids(broker.bootstrap_servers, [granted], sent, timeout=60)
    assert ledger(sent, seen).lost == 0


def test_a_tls_connection_carries_many_records_and_concurrent_callers(
    agent_factory: AgentFactory, certs: Certs
) -> None:
    """Frames larger than a TLS record, and 8 threads sharing one client: sealing and
    opening keep the stream in step whatever the writes and reads are cut into."""
    agent, target = tls_agent(agent_factory, certs)
    with Client(target, ssl_context=certs.pki.client_context()) as client:
        outcomes = client.send_many("tls-bulk", [bytes([n % 256]) * 5000 for n in range(1000)])
        ids: list[str] = []
        threads = [
            threading.Thread(
                target=lambda: ids.extend(client.send("tls-threads", b"x") for _ in range(200))
            )
            for _ in range(8)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert all(isinstance(outcome, str) for outcome in outcomes)
    assert len(set(ids)) == 1600
    queues = {q["topic"]: q for q in agent.stats()["queues"]}
    assert queues.keys() >= {"tls-bulk", "tls-threads"}


def test_http_over_tls_takes_the_token_as_a_bearer(
    agent_factory: AgentFactory, certs: Certs
) -> None:
    digest = hashlib.sha256(TOKEN.encode()).hexdigest()
    agent, target = tls_agent(
        agent_factory,
        certs,
        f'[[access]]\nname = "web"\ntoken_sha256 = ["{digest}"]\ntopics = ["web-*"]\n',
    )
    tcp_socket(target).close()  # the listener is up
    port = int(target.rpartition(":")[2])

    def post(topic: str, token: str | None) -> tuple[int, dict[str, object], str | None]:
        connection = http.client.HTTPSConnection(
            "127.0.0.1", port, context=certs.pki.client_context(), timeout=10
        )
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        try:
            connection.request("POST", f"/v1/topics/{topic}", b'{"value": "v"}', headers)
            response = connection.getresponse()
            return (
                response.status,
                json.loads(response.read()),
                response.getheader("www-authenticate"),
            )
        finally:
            connection.close()

    status, body, _ = post("web-orders", TOKEN)
    assert status == 200, body
    assert post("secret", TOKEN)[0] == 403
    for token in (None, WRONG_TOKEN):
        status, body, challenge = post("web-orders", token)
        assert (status, challenge) == (401, "Bearer"), body
    assert agent.stats()["auth_failures"] == 2


def test_a_listener_other_hosts_can_reach_does_not_start_without_tls(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nspool_dir = "spool"\ntcp_listen = "0.0.0.0:{find_free_port()}"\n')
    agent = subprocess.run(
        [sys.executable, "-m", "eventspool", "agent", "--config", str(config)],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert agent.returncode != 0
    assert "agent.tcp_listen" in agent.stderr
    assert "set tls.cert_file and tls.key_file" in agent.stderr
    assert not (tmp_path / "spool").exists()


# ---- configuration -----------------------------------------------------------------------


def load(directory: Path, text: str, env: dict[str, str] | None = None) -> ConfigError | None:
    config = directory / "agent.toml"
    config.write_text('[agent]\nspool_dir = "spool"\n' + text)
    try:
        load_agent_config(config, env={} if env is None else env)
    except ConfigError as exc:
        return exc
    return None


def tls_table(certs: Certs, *, client_ca: bool = False) -> str:
    cert, key = certs.server
    ca = f'client_ca_file = "{certs.pki.ca_cert}"\n' if client_ca else ""
    return f'[tls]\ncert_file = "{cert}"\nkey_file = "{key}"\n{ca}'


def test_a_remote_listener_needs_tls_and_clients_that_prove_who_they_are(
    tmp_path: Path, certs: Certs
) -> None:
    remote = 'tcp_listen = "0.0.0.0:7070"\n'
    digest = "ab" * 32
    token_rule = f'[[access]]\ntoken_sha256 = ["{digest}"]\ntopics = ["t"]\n'
    error = load(tmp_path, remote + tls_table(certs))
    assert error is not None and error.key == "agent.tcp_listen"
    assert "tls.client_ca_file" in str(error) and "agent.allow_remote = true" in str(error)
    assert load(tmp_path, remote + "allow_remote = true\n" + tls_table(certs)) is None
    assert load(tmp_path, remote + tls_table(certs, client_ca=True)) is None
    assert load(tmp_path, remote + tls_table(certs) + token_rule) is None
    config = tmp_path / "agent.toml"
    loaded = load_agent_config(config, env={})
    assert loaded.tls is not None and loaded.tls.cert_file == certs.server[0]
    assert loaded.access[0].token_digests == (bytes.fromhex(digest),)


def test_tls_files_that_cannot_be_used_stop_the_start_naming_the_setting(
    tmp_path: Path, certs: Certs
) -> None:
    listen = 'tcp_listen = "127.0.0.1:7070"\n'
    cert, key = certs.server
    junk = tmp_path / "junk.pem"
    junk.write_text("not PEM\n")
    cases = [
        (f'[tls]\ncert_file = "{cert}"\n', "tls.key_file", "tls.key_file is not"),
        (f'[tls]\ncert_file = "{cert}"\nkey_file = "nowhere.key"\n', "tls.key_file", "nowhere"),
        (f'[tls]\ncert_file = "{junk}"\nkey_file = "{key}"\n', "tls.cert_file", "not a PEM"),
        (
            f'[tls]\ncert_file = "{cert}"\nkey_file = "{certs.billing[1]}"\n',
            "tls.key_file",
            "not a PEM private key matching tls.cert_file",
        ),
        (
            f'[tls]\ncert_file = "{cert}"\nkey_file = "{key}"\nclient_ca_file = "no-ca.pem"\n',
            "tls.client_ca_file",
            "no-ca.pem",
        ),
    ]
    for text, key_name, message in cases:
        error = load(tmp_path, listen + text)
        assert error is not None, text
        assert (error.key, message in str(error)) == (key_name, True), str(error)
    error = load(tmp_path, tls_table(certs))
    assert error is not None and "agent.tcp_listen is not set" in str(error)
    env = {"EVENTSPOOL_TLS_KEY_FILE": "elsewhere.key"}
    error = load(tmp_path, listen + tls_table(certs), env)
    assert error is not None and "EVENTSPOOL_TLS_KEY_FILE (tls.key_file)" in str(error)


def test_certificate_names_and_tokens_in_rules_need_what_carries_them(
    tmp_path: Path, certs: Certs
) -> None:
    listen = 'tcp_listen = "127.0.0.1:7070"\n'
    cases = [
        (
            listen + tls_table(certs) + '[[access]]\ncert_cns = ["billing"]\n',
            "access[0].cert_cns",
            "tls.client_ca_file",
        ),
        (
            listen + f'[[access]]\ntoken_sha256 = ["{"ab" * 32}"]\n',
            "access[0].token_sha256",
            "only over TLS",
        ),
        (
            listen + tls_table(certs) + '[[access]]\ntoken_sha256 = ["secret"]\n',
            "access[0].token_sha256",
            "64 hex digits",
        ),
    ]
    for text, key, message in cases:
        error = load(tmp_path, text)
        assert error is not None and error.key == key and message in str(error), error


# ---- grants --------------------------------------------------------------------------------

names = st.sampled_from(["billing", "ops", "other"])
tokens = st.sampled_from([b"t1", b"t2", b"t3"])
patterns = st.lists(st.sampled_from(["a", "b", "a*", "*"]), max_size=3)
rules = st.lists(
    st.builds(
        PeerRule,
        name=st.sampled_from(["r1", "r2", "r3"]),
        uids=st.just(frozenset()),
        gids=st.just(frozenset()),
        topics=patterns.map(tuple),
        exchanges=patterns.map(tuple),
        cert_cns=st.frozensets(names, max_size=2),
        token_digests=st.lists(tokens.map(token_digest), max_size=2).map(tuple),
    ),
    min_size=1,
    max_size=4,
)


@given(
    rules=rules,
    cn=st.none() | names,
    token=st.none() | tokens,
    name=st.sampled_from("abc"),
)
def test_a_tcp_grant_is_never_more_than_the_union_of_the_rules_its_proofs_match(
    rules: list[PeerRule], cn: str | None, token: bytes | None, name: str
) -> None:
    digest = None if token is None else token_digest(token)
    grant = PeerRules(rules).grant(Peer(None, None, None, "10.0.0.1:5000", cn, digest))
    assert grant is not None
    matching = [
        rule
        for rule in rules
        if (cn is not None and cn in rule.cert_cns) or (digest in rule.token_digests)
    ]
    assert_grant_is_the_union(grant, matching, name)


def test_tls_client_arguments_are_checked_before_connecting(tmp_path: Path) -> None:
    context = ssl.create_default_context()
    cases: list[tuple[Path | str, dict[str, Any], str]] = [
        (tmp_path / "agent.sock", {"ssl_context": context}, "unix socket path"),
        ("tcp://127.0.0.1:7070", {"token": "t"}, "only over TLS"),
        ("tcp://127.0.0.1", {}, "host:port"),
        ("tcp://127.0.0.1:0", {}, "1..65535"),
    ]
    for target, kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            Client(target, **kwargs)
        with pytest.raises(ValueError, match=message):
            AsyncClient(target, **kwargs)
