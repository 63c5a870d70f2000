"""The matching rule as one regular expression per binding key: the trie's reference.

Slow on purpose (one regex per binding, tried one after the other), and so simple it can
be checked by eye: the property tests compare the trie against it, and the routing
benchmark uses the same loop as its anchor.

A routing key is matched with a '.' after every word (`a.b` becomes `a.b.`, the empty
key stays empty), so that every word of a binding key maps to a piece ending in `\\.`:
a literal word to itself, `*` to one word, `#` to any number of words.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

from eventspool.routing.trie import HASH, STAR, words

T = TypeVar("T", bound=Hashable)

_ONE_WORD = r"[^.]*\."


def binding_regex(binding_key: str) -> re.Pattern[str]:
    """The regular expression a routing key, with a '.' after each word, must fully match."""
    parts = []
    for word in words(binding_key):
        if word == HASH:
            parts.append(f"(?:{_ONE_WORD})*")
        elif word == STAR:
            parts.append(_ONE_WORD)
        else:
            parts.append(re.escape(word) + r"\.")
    return re.compile("".join(parts))


def subject(routing_key: str) -> str:
    """The routing key as the regular expressions see it: each word followed by '.'."""
    return routing_key + "." if routing_key else ""


class RegexMatcher(Generic[T]):
    """The same interface as TopicTrie, by trying every binding's regex in turn."""

    def __init__(self, bindings: Iterable[tuple[str, T]]) -> None:
        self._patterns = [(binding_regex(key), value) for key, value in bindings]

    def match(self, routing_key: str) -> frozenset[T]:
        text = subject(routing_key)
        return frozenset(value for regex, value in self._patterns if regex.fullmatch(text))
