"""librdkafka's own log lines, through Python logging, one per broker and kind per interval.

A broker that is not there makes librdkafka log every reconnect attempt: hundreds of
identical "Connect to ... failed" lines a minute, which bury everything else and say
nothing about what to do. Every librdkafka handle of eventspool logs through `LOGGER`,
whose filter lets the first line of each (broker, kind) through, counts the repeats for
`interval_s`, and adds what to check to the lines a user can act on.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

LOGGER_NAME = "eventspool.librdkafka"
INTERVAL_S = 30.0

_BROKER = re.compile(r"\[thrd:([^\]/]+)")
_NUMBERS = re.compile(r"\d+")
_HINTS = (
    (
        re.compile(r"Connection refused|Connect to .* failed|timed out|Name or service not known"),
        "is a broker running there? Check bootstrap.servers (the embedded one: "
        "'eventspool broker start' prints its address)",
    ),
    (
        re.compile(r"SSL|certificate", re.IGNORECASE),
        "check the ssl.* settings against the broker's listener",
    ),
    (
        re.compile(r"SASL|authentication", re.IGNORECASE),
        "check security.protocol and the sasl.* settings",
    ),
)


_INSTALL_LOCK = threading.Lock()


class RepeatFilter(logging.Filter):
    """Lets one librdkafka line of each (broker, kind) through per interval."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (until, repeats)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        text = str(args[-1]) if args else record.getMessage()
        facility = str(args[0]) if args else ""
        broker = match.group(1) if (match := _BROKER.search(text)) else "-"
        key = (broker, facility + _NUMBERS.sub("#", text.split("]: ", 1)[-1]))
        now = self._clock()
        with self._lock:
            until, repeats = self._seen.get(key, (0.0, 0))
            if now < until:
                self._seen[key] = (until, repeats + 1)
                return False
            self._seen[key] = (now + self._interval_s, 0)
        hint = next((advice for pattern, advice in _HINTS if pattern.search(text)), None)
        extra = []
        if repeats:
            extra.append(f"{repeats} more like it in the last {self._interval_s:.0f} s")
        if hint is not None and record.levelno >= logging.WARNING:
            extra.append(hint)
        if extra:
            record.msg = f"{record.msg} (%s)"
            record.args = (*args, "; ".join(extra)) if args else ("; ".join(extra),)
        return True


def librdkafka_logger() -> logging.Logger:
    """The logger every librdkafka handle of eventspool is given (its `logger` setting)."""
    logger = logging.getLogger(LOGGER_NAME)
    with _INSTALL_LOCK:
        if not any(isinstance(f, RepeatFilter) for f in logger.filters):
            logger.addFilter(RepeatFilter())
    return logger
