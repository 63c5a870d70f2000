"""The exchange table of a spool: configured vs runtime, persistence, counters, errors."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from eventspool.errors import (
    ExchangeConflictError,
    InvalidExchangeError,
    QueueFileError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.routing.exchanges import Binding, Exchange, ExchangeType, Route
from eventspool.routing.table import EXCHANGES_FILE, ExchangeCounts, ExchangeTable, Source

CONFIGURED = Exchange("configured", ExchangeType.FANOUT, (Binding("a"), Binding("b")))
RUNTIME = Exchange("runtime", ExchangeType.DIRECT, (Binding("t", "k"),), "lost")


def test_runtime_declarations_survive_reopening(tmp_path: Path) -> None:
    table = ExchangeTable(tmp_path, [CONFIGURED])
    assert table.declare(RUNTIME) is True
    changed = Exchange("runtime", ExchangeType.TOPIC, (Binding("t", "k.#"),))
    assert table.declare(changed) is False
    assert table.route("runtime", "k.x") == Route(("t",))

    reopened = ExchangeTable(tmp_path, [CONFIGURED])
    assert [(i.exchange, i.source) for i in reopened.infos()] == [
        (CONFIGURED, Source.CONFIG),
        (changed, Source.RUNTIME),
    ]
    saved = json.loads((tmp_path / EXCHANGES_FILE).read_text())
    assert [item["name"] for item in saved["exchanges"]] == ["runtime"]

    reopened.delete("runtime")
    assert [i.exchange.name for i in ExchangeTable(tmp_path).infos()] == []
    with pytest.raises(UnknownExchangeError, match="'runtime' is not declared"):
        reopened.route("runtime", "k")


def test_configured_exchanges_are_read_only_at_runtime(tmp_path: Path) -> None:
    table = ExchangeTable(tmp_path, [CONFIGURED])
    with pytest.raises(ExchangeConflictError, match="change it there"):
        table.declare(Exchange("configured", ExchangeType.DIRECT))
    with pytest.raises(ExchangeConflictError, match="remove it there"):
        table.delete("configured")
    with pytest.raises(UnknownExchangeError):
        table.delete("never-declared")
    with pytest.raises(InvalidExchangeError, match="declared twice"):
        ExchangeTable(tmp_path, [CONFIGURED, CONFIGURED])


def test_configuration_shadows_a_runtime_declaration_of_the_same_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ExchangeTable(tmp_path).declare(Exchange("configured", ExchangeType.DIRECT))
    with caplog.at_level(logging.WARNING):
        table = ExchangeTable(tmp_path, [CONFIGURED])
    assert "the configured one is used" in caplog.text
    assert table.info("configured").exchange == CONFIGURED
    assert table.route("configured", "") == Route(("a", "b"))


def test_unroutable_events_are_counted_by_outcome(tmp_path: Path) -> None:
    table = ExchangeTable(tmp_path, [CONFIGURED, Exchange("strict", ExchangeType.DIRECT)])
    table.declare(RUNTIME)
    routed = table.route("runtime", "k")
    alternate = table.route("runtime", "other")
    assert alternate == Route(("lost",), unroutable=True)
    table.written("runtime", routed)
    table.written("runtime", alternate)
    table.written("runtime", alternate)
    with pytest.raises(UnroutableError, match="no alternate_topic: nothing was written"):
        table.route("strict", "k")
    assert table.counts("runtime") == ExchangeCounts(routed=1, alternate=2, refused=0)
    assert table.all_counts() == {
        "runtime": ExchangeCounts(1, 2, 0),
        "strict": ExchangeCounts(0, 0, 1),
    }
    assert table.info("configured").counts == ExchangeCounts()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "unreadable exchange declarations"),
        ('{"version": 2, "exchanges": []}', "not an exchange declaration file of version 1"),
        ('{"version": 1, "exchanges": [{"type": "topic"}]}', "a declaration without a name"),
        ('{"version": 1, "exchanges": [{"name": "x", "type": "t"}]}', "type 't' is not one of"),
    ],
)
def test_a_damaged_file_is_an_error_not_an_empty_table(
    tmp_path: Path, content: str, message: str
) -> None:
    (tmp_path / EXCHANGES_FILE).write_text(content)
    with pytest.raises(QueueFileError, match=message) as info:
        ExchangeTable(tmp_path)
    assert info.value.path == str(tmp_path / EXCHANGES_FILE)


def test_a_declaration_that_cannot_be_saved_takes_no_effect(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    table = ExchangeTable(directory)
    shutil.rmtree(directory)
    with pytest.raises(QueueFileError, match="cannot save exchange declarations"):
        table.declare(RUNTIME)
    with pytest.raises(UnknownExchangeError):
        table.route("runtime", "k")
