"""Which topics and exchanges the agent serves, and to whom.

`allowed_topics` and `allowed_exchanges` bound what the agent serves at all. `[[access]]`
rules bound what each peer may use: a local one by the uid and gid the kernel reports for
the unix socket (SO_PEERCRED), a TCP one by the common name of its verified client
certificate or by the token it presented. A peer gets the union of the rules that match
it and nothing more; with no rules, the socket's file permissions (and, on TCP, the TLS
settings) alone decide, as before.

Patterns are shell-style globs (`orders.*`, `logs-??`), matched case-sensitively against
the whole name. A name no pattern matches is refused as FORBIDDEN before anything is
spooled, so it creates no queue file. Without patterns (the default) every valid name
is served, as before. Answers are cached per name: a refused flood of made-up names
costs one match each, and the cache is bounded so the flood cannot grow it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

_CACHE_MAX = 4096
_LOGGED_MAX = 100


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
        # Read for every request: with no patterns, nothing else is looked at.
        self.active = topics is not None or exchanges is not None

    def refusal(self, name: str, *, exchange: bool) -> str | None:
        """Why a send to `name` is refused, or None when it is allowed."""
        patterns = self.exchanges if exchange else self.topics
        if patterns.allows(name):
            return None
        self.refused += 1
        kind, key = ("exchange", "allowed_exchanges") if exchange else ("topic", "allowed_topics")
        return f"{kind} {name!r} is not allowed on this agent ({key} in agent.toml)"


def token_digest(token: bytes) -> bytes:
    """What agent.toml holds of a token (as hex): its SHA-256, so the file keeps no secret."""
    return hashlib.sha256(token).digest()


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is on the other end: a unix socket's process (SO_PEERCRED), or a TCP client
    with what it proved (a verified certificate's common name, a token's digest)."""

    pid: int | None
    uid: int | None
    gid: int | None
    address: str | None = None
    cert_cn: str | None = None
    token_digest: bytes | None = None

    def __str__(self) -> str:
        if self.uid is not None:
            return f"pid {self.pid} (uid {self.uid}, gid {self.gid})"
        proofs = [f"certificate CN {self.cert_cn!r}"] if self.cert_cn is not None else []
        if self.token_digest is not None:
            proofs.append(f"token sha256 {self.token_digest.hex()[:12]}...")
        where = f"TCP client {self.address}" if self.address else "a TCP client"
        return f"{where} ({', '.join(proofs)})" if proofs else where


@dataclass(frozen=True, slots=True)
class PeerRule:
    """`[[access]]` in agent.toml: the peers it matches (by uid or primary gid, or on TCP
    by certificate common name or token) may use the topics and exchanges its patterns
    name."""

    name: str
    uids: frozenset[int]
    gids: frozenset[int]
    topics: tuple[str, ...]
    exchanges: tuple[str, ...]
    cert_cns: frozenset[str] = frozenset()
    token_digests: tuple[bytes, ...] = ()

    def matches(self, peer: Peer) -> bool:
        if peer.uid is not None:
            return peer.uid in self.uids or peer.gid in self.gids
        if peer.cert_cn is not None and peer.cert_cn in self.cert_cns:
            return True
        return peer.token_digest is not None and self.knows(peer.token_digest)

    def knows(self, digest: bytes) -> bool:
        """Whether `digest` is one of this rule's tokens; every one is compared in
        constant time, so the time taken tells nothing about near misses."""
        found = False
        for known in self.token_digests:
            found |= hmac.compare_digest(known, digest)
        return found


class Grant:
    """What one peer may use: the union of the rules that match it, nothing beyond."""

    def __init__(self, peer: Peer, rules: Sequence[PeerRule]) -> None:
        self.peer = peer
        self.rules = tuple(rule.name for rule in rules)
        self._logged: set[str] = set()
        self._topics = NamePatterns([p for rule in rules for p in rule.topics])
        self._exchanges = NamePatterns([p for rule in rules for p in rule.exchanges])

    def refusal(self, name: str, *, exchange: bool) -> str | None:
        """Why this peer may not send to `name`, naming the rules that decided; None if it may."""
        if (self._exchanges if exchange else self._topics).allows(name):
            return None
        kind = "exchange" if exchange else "topic"
        decided = ", ".join(self.rules) if self.rules else "no [[access]] rule matches it"
        return f"{self.peer} may not use {kind} {name!r} (rules: {decided})"

    def logged(self, name: str) -> bool:
        """True the first time `name` is refused to this peer (bounded): one access-log
        line per peer and name, not one per event."""
        if name in self._logged or len(self._logged) >= _LOGGED_MAX:
            return False
        self._logged.add(name)
        return True


class PeerRules:
    """Every `[[access]]` rule; without any, a peer gets no grant to check (the socket's
    own permissions decide, as before). Refusals are counted per deciding rule."""

    def __init__(self, rules: Sequence[PeerRule]) -> None:
        self.rules = tuple(rules)
        self.refusals: Counter[str] = Counter()
        # A TCP client must then present a token (AUTH) before anything else.
        self.tokens = any(rule.token_digests for rule in self.rules)

    def knows(self, digest: bytes) -> bool:
        """Whether any rule has this token; all are compared, whichever matches."""
        found = False
        for rule in self.rules:
            found |= rule.knows(digest)
        return found

    def grant(self, peer: Peer) -> Grant | None:
        if not self.rules:
            return None
        return Grant(peer, [rule for rule in self.rules if rule.matches(peer)])

    def refused(self, grant: Grant) -> None:
        for rule in grant.rules or ("(none)",):
            self.refusals[rule] += 1
