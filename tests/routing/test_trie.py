"""Topic-exchange matching: the tutorial's cases, the edge cases, and the trie against regexes."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventspool.routing.reference import RegexMatcher, binding_regex, subject
from eventspool.routing.trie import TopicTrie, words

TUTORIAL = [("*.orange.*", "Q1"), ("*.*.rabbit", "Q2"), ("lazy.#", "Q2")]


@pytest.mark.parametrize(
    ("routing_key", "queues"),
    [
        ("quick.orange.rabbit", {"Q1", "Q2"}),
        ("lazy.orange.elephant", {"Q1", "Q2"}),
        ("quick.orange.fox", {"Q1"}),
        ("lazy.brown.fox", {"Q2"}),
        ("lazy.pink.rabbit", {"Q2"}),
        ("quick.brown.fox", set()),
        ("orange", set()),
        ("quick.orange.new.rabbit", set()),
        ("lazy.orange.new.rabbit", {"Q2"}),
    ],
)
def test_the_tutorial_cases(routing_key: str, queues: set[str]) -> None:
    assert TopicTrie(TUTORIAL).match(routing_key) == queues
    assert RegexMatcher(TUTORIAL).match(routing_key) == queues


@pytest.mark.parametrize(
    ("binding_key", "routing_key", "matches"),
    [
        ("#", "", True),
        ("#", "a.b.c", True),
        ("*", "", False),
        ("*", "a", True),
        ("*", "a.b", False),
        ("", "", True),
        ("", "a", False),
        ("a.#", "a", True),
        ("#.a", "a", True),
        ("a.#.b", "a.b", True),
        ("a.#.b", "a.x.y.b", True),
        ("a.#.b", "a.x.y.c", False),
        ("#.#", "", True),
        ("#.*", "", False),
        ("#.*.#", "x", True),
        ("*.*", "a..", False),
        ("*.*.*", "a..", True),
        ("a..b", "a..b", True),
        ("a.*.b", "a..b", True),
        ("a*", "ab", False),
        ("a*", "a*", True),
        ("#a", "#a", True),
        ("#a", "x", False),
    ],
)
def test_edge_cases(binding_key: str, routing_key: str, matches: bool) -> None:
    expected = {"t"} if matches else set()
    assert TopicTrie([(binding_key, "t")]).match(routing_key) == expected
    assert RegexMatcher([(binding_key, "t")]).match(routing_key) == expected


def test_words_of_the_empty_key_and_of_empty_words() -> None:
    assert words("") == []
    assert words("a..b") == ["a", "", "b"]
    assert words(".") == ["", ""]
    assert subject("") == ""
    assert binding_regex("a.*.#").fullmatch(subject("a.b.c.d"))


def test_a_value_bound_several_times_is_returned_once() -> None:
    trie = TopicTrie([("a.*", "t"), ("a.#", "t"), ("*.b", "t"), ("a.b", "u")])
    assert trie.match("a.b") == {"t", "u"}
    assert len(trie) == 4


def test_many_hashes_do_not_blow_up() -> None:
    """A backtracking matcher tries C(80, 20) splits here; the state set stays tiny."""
    pattern = ".".join(["#"] * 20 + ["never"])
    key = ".".join(["w"] * 60)
    started = time.perf_counter()
    assert TopicTrie([(pattern, "t")]).match(key) == set()
    assert TopicTrie([(pattern, "t")]).match(key + ".never") == {"t"}
    assert time.perf_counter() - started < 2.0


# Few distinct words, so random keys and patterns match often enough to be worth checking.
_KEY_WORDS = st.sampled_from(["a", "b", "c", "", "ab"])
_PATTERN_WORDS = st.sampled_from(["a", "b", "c", "", "ab", "*", "#", "a*", "#b"])
routing_keys = st.lists(_KEY_WORDS, max_size=7).map(".".join)
binding_keys = st.lists(_PATTERN_WORDS, max_size=6).map(".".join)


@given(binding_keys, routing_keys)
@settings(max_examples=2000)
def test_one_binding_agrees_with_its_regex(binding_key: str, routing_key: str) -> None:
    expected = {0} if binding_regex(binding_key).fullmatch(subject(routing_key)) else set()
    assert TopicTrie([(binding_key, 0)]).match(routing_key) == expected


@given(st.lists(st.tuples(binding_keys, st.integers(0, 5)), max_size=40), st.lists(routing_keys))
@settings(max_examples=500)
def test_many_bindings_agree_with_the_regex_loop(
    bindings: list[tuple[str, int]], keys: list[str]
) -> None:
    trie = TopicTrie(bindings)
    reference = RegexMatcher(bindings)
    for routing_key in keys:
        assert trie.match(routing_key) == reference.match(routing_key), routing_key
