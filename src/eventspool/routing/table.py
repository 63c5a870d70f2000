"""The exchanges of one spool: configured ones, plus runtime ones kept in the spool directory.

    DIR/exchanges.json   {"version": 1, "exchanges": [<declaration>, ...]}

Only runtime declarations are in the file; configured exchanges live in the
configuration, which stays their only source of truth: a runtime declaration or
deletion of a configured name is refused (ExchangeConflictError). A runtime declaration
is written to the file (atomically, fsynced) before it takes effect, so one that was
answered survives a crash and a restart. A configured exchange shadows a runtime one of
the same name found in the file; the runtime one is kept there, with a warning.

Routing reads one immutable snapshot (a dict of compiled exchanges) that a declaration
replaces as a whole: sends never take a lock to route.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from eventspool.errors import (
    ExchangeConflictError,
    InvalidExchangeError,
    QueueFileError,
    UnknownExchangeError,
    UnroutableError,
)
from eventspool.routing.exchanges import CompiledExchange, Exchange, Route

log = logging.getLogger(__name__)

EXCHANGES_FILE = "exchanges.json"
_FILE_VERSION = 1
# Slots of an exchange's counters.
_ROUTED, _ALTERNATE, _REFUSED = 0, 1, 2


class Source(StrEnum):
    CONFIG = "config"
    RUNTIME = "runtime"


@dataclass(frozen=True, slots=True)
class ExchangeCounts:
    """Events through one exchange since the spool was opened.

    `routed`: written to bound topics; `alternate`: unroutable, written to the alternate
    topic; `refused`: unroutable without an alternate topic, refused to the caller.
    """

    routed: int = 0
    alternate: int = 0
    refused: int = 0


@dataclass(frozen=True, slots=True)
class ExchangeInfo:
    exchange: Exchange
    source: Source
    counts: ExchangeCounts


class ExchangeTable:
    def __init__(self, directory: Path, configured: Iterable[Exchange] = ()) -> None:
        self._path = directory / EXCHANGES_FILE
        static: dict[str, Exchange] = {}
        for exchange in configured:
            if exchange.name in static:
                raise InvalidExchangeError(f"exchange {exchange.name!r} is declared twice")
            static[exchange.name] = exchange
        self._static: Mapping[str, Exchange] = static
        self._runtime: Mapping[str, Exchange] = load_declarations(self._path)
        for name in sorted(self._runtime.keys() & static.keys()):
            log.warning(
                "exchange %r is configured and also declared at runtime in %s: "
                "the configured one is used",
                name,
                self._path,
            )
        self._compiled = self._compile()
        self._lock = threading.Lock()
        self._counts_lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}

    def _compile(self) -> dict[str, CompiledExchange]:
        active = {**self._runtime, **self._static}
        return {name: CompiledExchange.build(exchange) for name, exchange in active.items()}

    # ---- routing -------------------------------------------------------------------

    def route(self, exchange: str, routing_key: str) -> Route:
        """Where an event goes; raises UnknownExchangeError or UnroutableError (counted)."""
        compiled = self._compiled.get(exchange)
        if compiled is None:
            raise UnknownExchangeError(f"exchange {exchange!r} is not declared")
        route = compiled.route(routing_key)
        if route is None:
            self._add(exchange, _REFUSED)
            raise UnroutableError(
                f"routing key {routing_key!r} matches no binding of exchange {exchange!r}, "
                "which has no alternate_topic: nothing was written"
            )
        return route

    def written(self, exchange: str, route: Route) -> None:
        """Count an event written along `route` (once every target has it)."""
        self._add(exchange, _ALTERNATE if route.unroutable else _ROUTED)

    def _add(self, exchange: str, slot: int) -> None:
        with self._counts_lock:
            counts = self._counts.get(exchange)
            if counts is None:
                counts = self._counts[exchange] = [0, 0, 0]
            counts[slot] += 1

    def counts(self, exchange: str) -> ExchangeCounts:
        with self._counts_lock:
            return ExchangeCounts(*self._counts.get(exchange, (0, 0, 0)))

    def all_counts(self) -> dict[str, ExchangeCounts]:
        """Counts of every exchange that saw an event, deleted ones included."""
        with self._counts_lock:
            return {name: ExchangeCounts(*counts) for name, counts in self._counts.items()}

    # ---- declarations ----------------------------------------------------------------

    def info(self, name: str) -> ExchangeInfo:
        compiled = self._compiled.get(name)
        if compiled is None:
            raise UnknownExchangeError(f"exchange {name!r} is not declared")
        return self._info(compiled)

    def infos(self) -> list[ExchangeInfo]:
        """Every active exchange, by name, from one snapshot."""
        compiled = self._compiled
        return [self._info(compiled[name]) for name in sorted(compiled)]

    def _info(self, compiled: CompiledExchange) -> ExchangeInfo:
        name = compiled.exchange.name
        source = Source.CONFIG if name in self._static else Source.RUNTIME
        return ExchangeInfo(compiled.exchange, source, self.counts(name))

    def declare(self, exchange: Exchange) -> bool:
        """Create or replace a runtime exchange, durably; True when it is new."""
        with self._lock:
            if exchange.name in self._static:
                raise ExchangeConflictError(
                    f"exchange {exchange.name!r} is declared in the configuration; change it there"
                )
            created = exchange.name not in self._runtime
            runtime = {**self._runtime, exchange.name: exchange}
            save_declarations(self._path, runtime)
            self._runtime = runtime
            self._compiled = self._compile()
        return created

    def delete(self, name: str) -> None:
        """Remove a runtime exchange, durably; sends to it then fail as unknown."""
        with self._lock:
            if name in self._static:
                raise ExchangeConflictError(
                    f"exchange {name!r} is declared in the configuration; remove it there"
                )
            if name not in self._runtime:
                raise UnknownExchangeError(f"exchange {name!r} is not declared")
            runtime = {key: value for key, value in self._runtime.items() if key != name}
            save_declarations(self._path, runtime)
            self._runtime = runtime
            self._compiled = self._compile()


def load_declarations(path: Path) -> dict[str, Exchange]:
    """The runtime declarations in `path`; a damaged file is an error, never ignored.

    Ignoring it would route events as if those exchanges had never been declared.
    """
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise QueueFileError(str(path), f"unreadable exchange declarations: {exc}") from exc
    if (
        not isinstance(document, dict)
        or document.get("version") != _FILE_VERSION
        or not isinstance(document.get("exchanges"), list)
    ):
        raise QueueFileError(
            str(path), f"not an exchange declaration file of version {_FILE_VERSION}"
        )
    declarations: dict[str, Exchange] = {}
    for item in document["exchanges"]:
        name = item.get("name") if isinstance(item, dict) else None
        try:
            if not isinstance(name, str):
                raise InvalidExchangeError(f"a declaration without a name: {item!r}")
            declarations[name] = Exchange.from_json(name, item)
        except InvalidExchangeError as exc:
            raise QueueFileError(str(path), f"bad exchange declaration: {exc}") from exc
    return declarations


def save_declarations(path: Path, declarations: Mapping[str, Exchange]) -> None:
    """Write the file atomically and durably: a crash leaves the old one or the new one."""
    document = {
        "version": _FILE_VERSION,
        "exchanges": [declarations[name].to_json() for name in sorted(declarations)],
    }
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("w") as handle:
            json.dump(document, handle, indent=2)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise QueueFileError(str(path), f"cannot save exchange declarations: {exc}") from exc
