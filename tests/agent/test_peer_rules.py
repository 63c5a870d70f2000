"""[[access]] rules: what each local uid or gid may use, from the kernel's SO_PEERCRED.

The refusal test runs a child as another user: the test forks, drops to uid 65534 in the
child, and speaks the binary protocol on a socket the parent framed for it.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool._core.native import decode_results
from eventspool.agent.access import Grant, Peer, PeerRule, PeerRules
from eventspool.agent.config import load_agent_config
from eventspool.agent.config_loader import ConfigError
from eventspool.broker import LocalBroker
from eventspool.client.sync import Client
from eventspool.testing.agent import AgentProcess
from eventspool.wire.protocol import (
    FrameDecoder,
    FrameType,
    Status,
    WireEvent,
    decode_error,
    encode_send,
)

NOBODY = 65534
patterns = st.lists(st.sampled_from(["a", "b", "a*", "*", "c?"]), max_size=3)
rules = st.lists(
    st.builds(
        PeerRule,
        name=st.sampled_from(["r1", "r2", "r3"]),
        uids=st.frozensets(st.integers(0, 3), max_size=2),
        gids=st.frozensets(st.integers(0, 3), max_size=2),
        topics=patterns.map(tuple),
        exchanges=patterns.map(tuple),
    ),
    max_size=4,
)


@given(rules=rules, uid=st.integers(0, 3), gid=st.integers(0, 3), name=st.sampled_from("abcd"))
def test_a_grant_is_never_more_than_the_union_of_the_matching_rules(
    rules: list[PeerRule], uid: int, gid: int, name: str
) -> None:
    grant = PeerRules(rules).grant(Peer(1, uid, gid))
    if not rules:
        assert grant is None  # no rules: the socket's permissions decide, as before
        return
    assert grant is not None
    matching = [rule for rule in rules if uid in rule.uids or gid in rule.gids]
    assert_grant_is_the_union(grant, matching, name)


def assert_grant_is_the_union(grant: Grant, matching: list[PeerRule], name: str) -> None:
    """`name` is allowed, as a topic and as an exchange, exactly when one of the matching
    rules has a pattern for it, by fnmatch's own reading of the patterns."""
    for exchange in (False, True):
        granted = any(
            fnmatchcase(name, pattern)
            for rule in matching
            for pattern in (rule.exchanges if exchange else rule.topics)
        )
        assert (grant.refusal(name, exchange=exchange) is None) == granted


def test_access_tables_take_ids_and_names_and_refuse_nonsense(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        '[agent]\nspool_dir = "s"\n'
        '[[access]]\nname = "ops"\nusers = ["root"]\ntopics = ["*"]\n'
        '[[access]]\ngids = [65534]\ngroups = ["nogroup"]\ntopics = ["logs.*"]\n'
    )
    access = load_agent_config(config, env={}).access
    assert [(r.name, r.uids, r.gids, r.topics) for r in access] == [
        ("ops", frozenset({0}), frozenset(), ("*",)),
        ("access[1]", frozenset(), frozenset({65534}), ("logs.*",)),
    ]
    for body, key in [
        ('[[access]]\ntopics = ["*"]\n', "matches nobody"),
        ('[[access]]\nuids = [0]\ntopic = ["*"]\n', r"access\[0\]\.topic"),
        ('[[access]]\nusers = ["no-such-user-here"]\n', "no such user"),
        ('[[access]]\nuids = ["0"]\n', r"access\[0\]\.uids"),
    ]:
        config.write_text('[agent]\nspool_dir = "s"\n' + body)
        with pytest.raises(ConfigError, match=key):
            load_agent_config(config, env={})


def _as_nobody(socket_path: Path, frames: bytes, answers: int) -> bytes:
    """Send `frames` from a child running as uid 65534; the raw bytes it got back."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only syscalls, then _exit
        try:
            os.close(read_end)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(socket_path))
            sock.sendall(frames)
            data = b""
            decoder = FrameDecoder()
            got = 0
            while got < answers:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                got += len(decoder.feed(chunk))
            os.write(write_end, data)
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return data


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_another_user_is_served_what_its_rule_grants_and_refused_the_rest(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    granted = topic_factory(1)
    public = Path(tempfile.mkdtemp(prefix="eventspool-peer-"))
    public.chmod(0o755)
    agent = AgentProcess(
        tmp_path,
        broker.bootstrap_servers,
        'socket_mode = "0666"\n'
        f'[[access]]\nname = "app"\nuids = [{NOBODY}]\ntopics = ["{granted}"]\n'
        '[[access]]\nname = "ops"\nuids = [0]\ntopics = ["*"]\n',
        socket_path=public / "agent.sock",
    )
    agent.start()
    try:
        frames = encode_send(1, granted, [WireEvent(b"from nobody", None, None)])
        frames += encode_send(2, "secret", [WireEvent(b"not for nobody", None, None)])
        answers = FrameDecoder().feed(_as_nobody(agent.socket_path, frames, 2))
        with Client(agent.socket_path) as root:
            root.send("secret", b"root may")  # the ops rule grants uid 0 everything
            stats = root.stats()
    finally:
        agent.stop()
        public.joinpath("agent.sock").unlink(missing_ok=True)
        public.rmdir()
    by_id = {frame.request_id: frame for frame in answers}
    assert by_id[1].type is FrameType.SEND_RESULT
    assert isinstance(decode_results(by_id[1].body)[0], str)  # its event id
    assert by_id[2].type is FrameType.ERROR
    refusal = decode_error(by_id[2].body)
    assert refusal.status is Status.FORBIDDEN
    assert f"uid {NOBODY}" in refusal.text and "rules: app" in refusal.text
    assert stats["forbidden_by_rule"] == {"app": 1}
    log = agent.log_tail()
    assert "access refused" in log and f"uid {NOBODY}" in log and "rules: app" in log
    assert "pid " in log
