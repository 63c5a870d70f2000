"""Topic-exchange matching: every binding key in one trie, a routing key against all at once.

The semantics are RabbitMQ's. A key is a list of words separated by '.': `a.b.c` has
three words, `a..b` three (the middle one empty) and the empty key none. In a binding
key the word `*` matches exactly one word and `#` zero or more; every other word
matches itself only (`a*` is a plain word).

Matching moves a set of trie nodes along the routing key, one word at a time, like a
nondeterministic automaton: from each node along the edge labelled with the word and
along the `*` edge; a node entered through a `#` edge stays (it swallows the word); and
entering a node also enters the `#` children below it, which match zero words. The cost
grows with the words of the key and the nodes alive at once, not with the number of
bindings, and a node is never in the set twice, so patterns like `#.#.#` cannot blow
up as they do in a backtracking matcher.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)

STAR = "*"
HASH = "#"


def words(key: str) -> list[str]:
    """The words of a routing or binding key; the empty key has none."""
    return key.split(".") if key else []


class _Node(Generic[T]):
    __slots__ = ("any_word", "closure", "hash", "is_hash", "star", "values", "words")

    def __init__(self, is_hash: bool) -> None:
        self.words: dict[str, _Node[T]] = {}
        self.star: _Node[T] | None = None
        self.hash: _Node[T] | None = None
        self.is_hash = is_hash
        self.values: frozenset[T] = frozenset()
        # Filled in once the trie is complete. `closure`: this node and the `#` nodes
        # below it, which match zero words: entering one enters them all. `any_word`:
        # the nodes entered on any next word, whatever it is (through `*`, or staying
        # in a `#` node).
        self.closure: tuple[_Node[T], ...] = ()
        self.any_word: tuple[_Node[T], ...] = ()

    def child(self, word: str) -> _Node[T]:
        if word == HASH:
            if self.hash is None:
                self.hash = _Node(is_hash=True)
            return self.hash
        if word == STAR:
            if self.star is None:
                self.star = _Node(is_hash=False)
            return self.star
        node = self.words.get(word)
        if node is None:
            node = self.words[word] = _Node(is_hash=False)
        return node


class TopicTrie(Generic[T]):
    """An immutable set of (binding key, value) pairs; `match` returns the values that match.

    A value bound under several keys that all match is returned once. Immutable once
    built, so any number of threads may match concurrently without a lock.
    """

    def __init__(self, bindings: Iterable[tuple[str, T]]) -> None:
        self._root: _Node[T] = _Node(is_hash=False)
        count = 0
        for key, value in bindings:
            node = self._root
            for word in words(key):
                node = node.child(word)
            node.values = node.values | {value}
            count += 1
        self._size = count
        _close_over(self._root)
        self._start = self._root.closure

    def __len__(self) -> int:
        """How many bindings were added (duplicates included)."""
        return self._size

    def match(self, routing_key: str) -> frozenset[T]:
        """The values of every binding key that matches `routing_key`."""
        states: Iterable[_Node[T]] = self._start
        if routing_key:
            for word in routing_key.split("."):
                following: set[_Node[T]] = set()
                for node in states:
                    child = node.words.get(word)
                    if child is not None:
                        following.update(child.closure)
                    if node.any_word:
                        following.update(node.any_word)
                if not following:
                    return frozenset()
                states = following
        found: set[T] = set()
        for node in states:
            if node.values:
                found.update(node.values)
        return frozenset(found)


def _close_over(root: _Node[T]) -> None:
    """Fill in every node's closures, iteratively: binding keys may have a hundred words."""
    nodes = []
    stack = [root]
    while stack:
        node = stack.pop()
        nodes.append(node)
        chain = [node]
        below = node.hash
        while below is not None:
            chain.append(below)
            below = below.hash
        node.closure = tuple(chain)
        stack.extend(node.words.values())
        if node.star is not None:
            stack.append(node.star)
        if node.hash is not None:
            stack.append(node.hash)
    for node in nodes:  # every closure is known now
        reached = node.star.closure if node.star is not None else ()
        node.any_word = reached + node.closure if node.is_hash else reached
