"""Routing decisions per second with 10k bindings, and send() through an exchange.

1. Routing decisions: a topic exchange with `BINDINGS` binding keys shaped like
   `region.service.severity.event` (the region literal, then each word `#`, ending the
   key, with p=HASH_TAIL_CHANCE, else `*` with p=STAR_CHANCE, at most MAX_STARS, else a
   literal), bound to `TARGET_TOPICS` topics, routes 20,000 random four-word routing keys,
   cycled. Ours: the compiled exchange (the trie), as `Spool.send()` uses it, returning
   the sorted target topics. The anchor, in the same run on the same keys: the naive
   router, a loop over every binding's compiled regular expression
   (eventspool.routing.reference), collecting and sorting the topics; both answers are
   compared on every key the anchor routes. Also reported: the trie alone, a direct and
   a fanout exchange, and the build times.
2. send() through an exchange against a plain send() in the same run: one thread,
   keyless 100-byte values, durability `process`, 64 MiB rings, one partition per topic,
   no sender; the rings are emptied between passes, outside the timed region. Through
   the topic exchange of (1), with routing keys that each reach exactly one topic; and
   through a fanout exchange to three topics, all or nothing (three writes per event).

Each figure is the median over the repetitions.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eventspool.config import MIB, QueueSettings, SpoolSettings
from eventspool.pipeline import Spool
from eventspool.routing import Binding, Exchange, ExchangeType
from eventspool.routing.exchanges import CompiledExchange
from eventspool.routing.reference import RegexMatcher
from eventspool.routing.trie import TopicTrie
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.output import progress
from harness.rings import expect_emptied
from harness.runs import Runs, safe_ratio
from harness.session import Session

BINDINGS = 10_000
TARGET_TOPICS = 100
# Vocabulary per word position of a routing key: region.service.severity.event
POSITIONS = (20, 1000, 5, 100)
STAR_CHANCE = 0.15
MAX_STARS = 2
HASH_TAIL_CHANCE = 0.01
PAYLOAD_BYTES = 100
CAPACITY_BYTES = 64 * MIB
SEED = 20_240_807
FANOUT_TOPICS = ("fan-a", "fan-b", "fan-c")
ROUTING_KEYS = 20_000


@dataclass(frozen=True, slots=True)
class Profile:
    route_seconds: float  # per pass of ours
    anchor_keys: int  # per pass of the anchor (each costs one regex per binding)
    send_events: int  # per send() pass


QUICK = Profile(route_seconds=0.3, anchor_keys=150, send_events=30_000)
FULL = Profile(route_seconds=1.0, anchor_keys=600, send_events=150_000)


def word(position: int, index: int) -> str:
    return f"p{position}w{index}"


def binding_keys(rng: random.Random, count: int) -> list[str]:
    """Distinct binding keys: the region literal, then literals, up to two `*`, maybe `#`.

    Without a literal region, or with more wildcards, a few catch-all keys would bind
    most routing keys to most topics: unlike real routing tables.
    """
    keys: set[str] = set()
    while len(keys) < count:
        words = [word(0, rng.randrange(POSITIONS[0]))]
        stars = 0
        for position, size in enumerate(POSITIONS[1:], start=1):
            if rng.random() < HASH_TAIL_CHANCE:
                words.append("#")
                break
            if stars < MAX_STARS and rng.random() < STAR_CHANCE:
                words.append("*")
                stars += 1
            else:
                words.append(word(position, rng.randrange(size)))
        keys.add(".".join(words))
    return sorted(keys)


def routing_keys(rng: random.Random, count: int) -> list[str]:
    return [
        ".".join(word(position, rng.randrange(size)) for position, size in enumerate(POSITIONS))
        for _ in range(count)
    ]


def topic_exchange(keys: Sequence[str], rng: random.Random) -> Exchange:
    topics = [f"t{n:03d}" for n in range(TARGET_TOPICS)]
    return Exchange(
        "bench-topic",
        ExchangeType.TOPIC,
        tuple(Binding(rng.choice(topics), key) for key in keys),
        alternate_topic="bench-unroutable",
    )


def rate_of(route: Callable[[str], object], keys: Sequence[str], seconds: float) -> float:
    """Decisions per second, cycling over `keys` for about `seconds`."""
    done = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        for key in keys:
            route(key)
        done += len(keys)
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - started)


def send_pass(spool: Spool, call: Callable[[int], object], events: int, writes: int) -> float:
    """Events per second of `events` calls; checks that `writes` records were queued each."""
    started = time.perf_counter()
    for index in range(events):
        call(index)
    seconds = time.perf_counter() - started
    expect_emptied(spool, events * writes)
    return events / seconds


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    rng = random.Random(SEED)
    runs = Runs()
    facts: dict[str, object] = {}

    keys = binding_keys(rng, BINDINGS)
    exchange = topic_exchange(keys, rng)
    started = time.perf_counter()
    compiled = CompiledExchange.build(exchange)
    facts["trie_build_ms"] = round((time.perf_counter() - started) * 1000, 1)
    started = time.perf_counter()
    matcher = RegexMatcher((b.key, b.topic) for b in exchange.bindings)
    facts["regex_compile_ms"] = round((time.perf_counter() - started) * 1000, 1)
    trie = TopicTrie((b.key, b.topic) for b in exchange.bindings)
    literal_bindings = tuple(b for b in exchange.bindings if "*" not in b.key and "#" not in b.key)
    direct = CompiledExchange.build(Exchange("bench-direct", ExchangeType.DIRECT, literal_bindings))
    fanout_exchange = Exchange(
        "bench-fanout", ExchangeType.FANOUT, tuple(Binding(t) for t in FANOUT_TOPICS)
    )
    fanout = CompiledExchange.build(fanout_exchange)
    sample = routing_keys(rng, ROUTING_KEYS)

    def ours(key: str) -> tuple[str, ...]:
        found = compiled.route(key)
        return () if found is None or found.unroutable else found.topics

    def anchor(key: str) -> tuple[str, ...]:
        return tuple(sorted(matcher.match(key)))

    targets = [ours(key) for key in sample]
    facts["targets_per_key_mean"] = round(sum(map(len, targets)) / len(targets), 3)
    facts["unroutable_share"] = round(sum(1 for t in targets if not t) / len(targets), 4)
    progress(
        f"{BINDINGS:,} bindings: trie built in {facts['trie_build_ms']} ms, regexes compiled "
        f"in {facts['regex_compile_ms']} ms; {facts['targets_per_key_mean']} topics per key"
    )

    session = Session(args, "routing")
    one_target = [key for key, found in zip(sample, targets, strict=True) if len(found) == 1]
    value = bytes(PAYLOAD_BYTES)
    settings = SpoolSettings(queue=QueueSettings(capacity_bytes=CAPACITY_BYTES))
    exchanges = [exchange, fanout_exchange]
    with session, Spool(session.scratch, settings=settings, exchanges=exchanges) as spool:
        for topic in {*compiled.exchange.topics(), *FANOUT_TOPICS, "plain"}:
            spool.set_partition_count(topic, 1)
        send = spool.send
        n_keys = len(one_target)

        def plain(index: int) -> object:
            return send("plain", value)

        def through_topic(index: int) -> object:
            return send(None, value, exchange="bench-topic", routing_key=one_target[index % n_keys])

        def through_fanout(index: int) -> object:
            return send(None, value, exchange="bench-fanout")

        # (name, one call, records queued by each call)
        sends = (("plain", plain, 1), ("topic", through_topic, 1), ("fanout3", through_fanout, 3))
        for name, call, writes in sends:
            send_pass(spool, call, profile.send_events // 3, writes)  # warm-up, not recorded
            progress(f"warm-up: send {name}")

        for rep in range(args.repeats):
            runs.add("route_ours", rate_of(ours, sample, profile.route_seconds))
            anchor_keys = sample[rep * profile.anchor_keys : (rep + 1) * profile.anchor_keys]
            anchor_started = time.perf_counter()
            answers = [anchor(key) for key in anchor_keys]
            runs.add("route_anchor", len(anchor_keys) / (time.perf_counter() - anchor_started))
            if answers != [ours(key) for key in anchor_keys]:
                raise RuntimeError("the trie and the regex loop disagree")
            runs.add("trie_match", rate_of(trie.match, sample, profile.route_seconds))
            runs.add("route_direct", rate_of(direct.route, sample, profile.route_seconds / 3))
            runs.add("route_fanout", rate_of(fanout.route, sample, profile.route_seconds / 3))
            for name, call, writes in sends:
                runs.add(f"send_{name}", send_pass(spool, call, profile.send_events, writes))
            figures = {k: v[-1] for k, v in runs.values.items()}
            progress(
                f"rep {rep + 1}/{args.repeats}: route {figures['route_ours']:,.0f}/s vs regex "
                f"loop {figures['route_anchor']:,.0f}/s; send plain {figures['send_plain']:,.0f}/s,"
                f" topic exchange {figures['send_topic']:,.0f}/s, "
                f"fanout x3 {figures['send_fanout3']:,.0f}/s"
            )
    return build_result(args, profile, runs, facts | session.provenance(None, packages=()))


def build_result(
    args: BenchArgs, profile: Profile, runs: Runs, facts: dict[str, object]
) -> dict[str, object]:
    figures = runs.medians()
    ours, anchor = figures["route_ours"], figures["route_anchor"]
    return {
        "figure": "topic_routing_decisions_per_s_10k_bindings",
        "ours": round(ours),
        "anchor": round(anchor, 1),
        "ratio": safe_ratio(ours, anchor, 1),
        "unit": "routing decisions/s (one thread)",
        "title": "Routing decisions, topic exchange with 10k bindings",
        "anchor_is": "a loop over every binding's compiled regex",
        "figures": [
            figure(
                "send_topic_exchange_per_s",
                round(figures["send_topic"]),
                round(figures["send_plain"]),
                unit="events/s",
                title="send() through a topic exchange (one target)",
                anchor_is="a plain send() to a topic",
            ),
        ],
        "trie_match_per_s": round(figures["trie_match"]),
        "direct_route_per_s": round(figures["route_direct"]),
        "fanout_route_per_s": round(figures["route_fanout"]),
        "send_plain_per_s": round(figures["send_plain"]),
        "send_topic_exchange_per_s": round(figures["send_topic"]),
        "send_topic_exchange_vs_plain_ratio": safe_ratio(
            figures["send_topic"], figures["send_plain"], 3
        ),
        "send_fanout3_events_per_s": round(figures["send_fanout3"]),
        "send_fanout3_writes_per_s": round(3 * figures["send_fanout3"]),
        "send_fanout3_vs_plain_ratio": safe_ratio(
            figures["send_fanout3"], figures["send_plain"], 3
        ),
        "runs": {name: [round(v, 1) for v in values] for name, values in runs.values.items()},
        "settings": {
            "bindings": BINDINGS,
            "target_topics": TARGET_TOPICS,
            "binding_key_vocabularies": list(POSITIONS),
            "hash_tail_chance": HASH_TAIL_CHANCE,
            "star_chance": STAR_CHANCE,
            "max_stars": MAX_STARS,
            "routing_keys": ROUTING_KEYS,
            "anchor_keys_per_pass": profile.anchor_keys,
            "route_pass_seconds": profile.route_seconds,
            "payload_bytes": PAYLOAD_BYTES,
            "capacity_bytes_per_ring": CAPACITY_BYTES,
            "send_events_per_pass": profile.send_events,
            "fanout_topics": len(FANOUT_TOPICS),
            "repetitions": args.repeats,
            "quick": args.quick,
        },
        **facts,
    }


def main(argv: Sequence[str] | None = None) -> int:
    return bench_main("Routing decisions/s with 10k bindings; send() through exchanges", run, argv)


if __name__ == "__main__":
    sys.exit(main())
