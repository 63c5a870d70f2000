"""allowed_topics and allowed_exchanges: a name no pattern matches is refused as FORBIDDEN
and leaves nothing on disk; the patterns are checked as glob rules, cached and bounded."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool.agent.access import AllowList, NamePatterns
from eventspool.agent.config import load_agent_config
from eventspool.agent.config_loader import ConfigError
from eventspool.broker import LocalBroker
from eventspool.client.sync import Client
from eventspool.errors import ForbiddenError
from eventspool.verify import consume_event_ids, ledger
from tests.agent.conftest import AgentFactory, call

names = st.text(alphabet="abcdef.-_", min_size=1, max_size=12)


@given(patterns=st.lists(names, max_size=5), name=names)
def test_a_name_is_allowed_exactly_when_one_glob_matches_it(patterns: list[str], name: str) -> None:
    assert NamePatterns(patterns).allows(name) == any(
        fnmatch.fnmatchcase(name, p) for p in patterns
    )


def test_no_patterns_allow_everything_and_refusals_are_counted() -> None:
    allow = AllowList(None, ["audit.*"])
    assert allow.refusal("anything", exchange=False) is None
    assert allow.refusal("audit.eu", exchange=True) is None
    refusal = allow.refusal("billing", exchange=True)
    assert refusal is not None and "allowed_exchanges" in refusal
    assert allow.refused == 1


def test_the_config_takes_pattern_lists_from_the_file_and_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nspool_dir = "s"\nallowed_topics = ["orders", "logs.*"]\n')
    assert load_agent_config(config, env={}).allowed_topics == ("orders", "logs.*")
    env = {"EVENTSPOOL_AGENT_ALLOWED_TOPICS": "a, b.*"}
    assert load_agent_config(config, env=env).allowed_topics == ("a", "b.*")
    config.write_text('[agent]\nspool_dir = "s"\nallowed_topics = "orders"\n')
    with pytest.raises(ConfigError, match=r"agent\.allowed_topics"):
        load_agent_config(config, env={})


def test_a_topic_not_allowed_is_refused_and_creates_nothing(
    agent_factory: AgentFactory,
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
) -> None:
    topic = topic_factory(1)
    agent = agent_factory(
        f'allowed_topics = ["{topic}", "orders.*"]\nallowed_exchanges = ["audit"]\n'
        f'[exchanges.audit]\ntype = "fanout"\nbindings = [{{ topic = "{topic}" }}]\n'
        f'[exchanges.billing]\ntype = "fanout"\nbindings = [{{ topic = "{topic}" }}]\n'
    )
    agent.start()
    with Client(agent.socket_path) as client:
        event_id = client.send(topic, b"allowed")
        with pytest.raises(ForbiddenError, match="allowed_topics"):
            client.send("payments", b"refused")
        outcomes = client.send_many("other", [b"a", b"b"])
        with pytest.raises(ForbiddenError, match="allowed_exchanges"):
            client.send(None, b"x", exchange="billing")
        stats = client.stats()
    status, body = call(agent, "POST", "/v1/topics/payments", {"value": "x"})
    assert all(isinstance(outcome, ForbiddenError) for outcome in outcomes)
    assert status == 403, body
    assert body["results"][0]["status"] == "forbidden"
    assert stats["forbidden"] == 3
    assert sorted(p.name for p in (tmp_path / "spool" / "topics").iterdir()) == [topic]
    seen = consume_event_ids(broker.bootstrap_servers, [topic], [event_id], timeout=60)
    assert ledger([event_id], seen).lost == 0
