"""The local dead-letter file: events Kafka will never take, kept with the reason.

One JSON object per line, appended and fsynced before the event leaves its queue, so
an event is never silently dropped.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

DEAD_LETTER_FILE = "dead-letters.jsonl"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    topic: str
    partition: int
    event_id: str | None
    key: bytes | None
    value: bytes | None
    error_code: str
    reason: str
    time_ms: int


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


class DeadLetterFile:
    def __init__(self, directory: Path) -> None:
        self.path = directory / DEAD_LETTER_FILE
        self._lock = threading.Lock()
        self.count = sum(1 for _ in self.path.open()) if self.path.exists() else 0

    def write(self, letter: DeadLetter) -> None:
        line = json.dumps(
            {
                "topic": letter.topic,
                "partition": letter.partition,
                "event_id": letter.event_id,
                "key_b64": _b64(letter.key),
                "value_b64": _b64(letter.value),
                "error": letter.error_code,
                "reason": letter.reason,
                "time_ms": letter.time_ms,
            }
        )
        with self._lock, self.path.open("a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
            self.count += 1

    def read(self) -> list[dict[str, object]]:
        if not self.path.exists():
            return []
        with self.path.open() as handle:
            return [json.loads(line) for line in handle if line.strip()]
