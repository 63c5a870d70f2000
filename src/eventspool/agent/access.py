"""Which topics and exchanges the agent serves: `allowed_topics` and `allowed_exchanges`.

Patterns are shell-style globs (`orders.*`, `logs-??`), matched case-sensitively against
the whole name. A name no pattern matches is refused as FORBIDDEN before anything is
spooled, so it creates no queue file. Without patterns (the default) every valid name
is served, as before. Answers are cached per name: a refused flood of made-up names
costs one match each, and the cache is bounded so the flood cannot grow it.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence

_CACHE_MAX = 4096


class NamePatterns:
    """A set of glob patterns; None allows every name."""

    def __init__(self, patterns: Sequence[str] | None) -> None:
        self.patterns = None if patterns is None else tuple(patterns)
        # An empty list allows nothing: "(?!)" never matches.
        translated = [f"(?:{fnmatch.translate(pattern)})" for pattern in self.patterns or ()]
        alternatives = "|".join(translated) or "(?!)"
        self._match = None if self.patterns is None else re.compile(alternatives).match
        self._cache: dict[str, bool] = {}

    def allows(self, name: str) -> bool:
        if self._match is None:
            return True
        allowed = self._cache.get(name)
        if allowed is None:
            allowed = self._match(name) is not None
            if len(self._cache) < _CACHE_MAX:
                self._cache[name] = allowed
        return allowed


class AllowList:
    """The agent's allowed topics and exchanges, and how often each refused."""

    def __init__(self, topics: Sequence[str] | None, exchanges: Sequence[str] | None) -> None:
        self.topics = NamePatterns(topics)
        self.exchanges = NamePatterns(exchanges)
        self.refused = 0

    @property
    def active(self) -> bool:
        return self.topics.patterns is not None or self.exchanges.patterns is not None

    def refusal(self, name: str, *, exchange: bool) -> str | None:
        """Why a send to `name` is refused, or None when it is allowed."""
        patterns = self.exchanges if exchange else self.topics
        if patterns.allows(name):
            return None
        self.refused += 1
        kind, key = ("exchange", "allowed_exchanges") if exchange else ("topic", "allowed_topics")
        return f"{kind} {name!r} is not allowed on this agent ({key} in agent.toml)"
