"""Routing decisions per second with 10k bindings, and send() through an exchange.

1. Routing: a topic exchange of 10,000 binding keys `region.service.severity.event` (the
   region literal, then literals, at most two `*`, rarely a final `#`) bound to 100
   topics routes 20,000 random four-word keys, cycled. Ours: the compiled exchange (the
   trie) as `Spool.send()` uses it. The anchor, on the same keys: a loop over every
   binding's compiled regex (eventspool.routing.reference), its sorted topics checked
   against ours. Also reported (each repetition in "runs"): the trie alone, a direct and
   a fanout exchange; and the build times.
2. send() of keyless 100-byte values on one thread (durability `process`, 64 MiB rings,
   one partition per topic, no sender; the rings emptied between passes, untimed) through
   the topic exchange with keys that reach exactly one topic, against a plain send(); and
   through a fanout exchange to three topics (three writes per event).

Each figure is the median over the repetitions.
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable, Sequence

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
# By --quick: seconds per routing pass of ours, keys per pass of the anchor (each costs
# one regex per binding), events per send() pass.
ROUTE_SECONDS = {True: 0.3, False: 1.0}
ANCHOR_KEYS = {True: 150, False: 600}
SEND_EVENTS = {True: 30_000, False: 150_000}


def word(position: int, index: int) -> str:
    return f"p{position}w{index}"


def binding_keys(rng: random.Random, count: int) -> list[str]:
    """Distinct binding keys: the region literal, then literals, up to two `*`, maybe `#`;
    with more wildcards a few catch-all keys would bind most keys, unlike real tables."""
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
    route_seconds, anchor_keys = ROUTE_SECONDS[args.quick], ANCHOR_KEYS[args.quick]
    send_events = SEND_EVENTS[args.quick]
    rng = random.Random(SEED)
    runs = Runs()

    topics = [f"t{n:03d}" for n in range(TARGET_TOPICS)]
    bindings = tuple(Binding(rng.choice(topics), key) for key in binding_keys(rng, BINDINGS))
    exchange = Exchange(
        "bench-topic", ExchangeType.TOPIC, bindings, alternate_topic="bench-unroutable"
    )
    started = time.perf_counter()
    compiled = CompiledExchange.build(exchange)
    trie_build_ms = round((time.perf_counter() - started) * 1000, 1)
    started = time.perf_counter()
    matcher = RegexMatcher((b.key, b.topic) for b in exchange.bindings)
    regex_compile_ms = round((time.perf_counter() - started) * 1000, 1)
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

    targets = [ours(key) for key in sample]
    targets_per_key = round(sum(map(len, targets)) / len(targets), 3)
    progress(
        f"{BINDINGS:,} bindings: trie built in {trie_build_ms} ms, regexes compiled "
        f"in {regex_compile_ms} ms; {targets_per_key} topics per key"
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

        def plain(index: int) -> object:
            return send("plain", value)

        def through_topic(index: int) -> object:
            key = one_target[index % len(one_target)]
            return send(None, value, exchange="bench-topic", routing_key=key)

        def through_fanout(index: int) -> object:
            return send(None, value, exchange="bench-fanout")

        # (name, one call, records queued by each call)
        sends = (("plain", plain, 1), ("topic", through_topic, 1), ("fanout3", through_fanout, 3))
        for name, call, writes in sends:
            send_pass(spool, call, send_events // 3, writes)  # warm-up, not recorded
            progress(f"warm-up: send {name}")

        for rep in range(args.repeats):
            runs.add("route_ours", rate_of(ours, sample, route_seconds))
            keys = sample[rep * anchor_keys : (rep + 1) * anchor_keys]
            anchor_started = time.perf_counter()
            answers = [tuple(sorted(matcher.match(key))) for key in keys]
            runs.add("route_anchor", len(keys) / (time.perf_counter() - anchor_started))
            if answers != [ours(key) for key in keys]:
                raise RuntimeError("the trie and the regex loop disagree")
            runs.add("trie_match", rate_of(trie.match, sample, route_seconds))
            runs.add("route_direct", rate_of(direct.route, sample, route_seconds / 3))
            runs.add("route_fanout", rate_of(fanout.route, sample, route_seconds / 3))
            for name, call, writes in sends:
                runs.add(f"send_{name}", send_pass(spool, call, send_events, writes))
            last = {name: values[-1] for name, values in runs.values.items()}
            progress(
                f"rep {rep + 1}/{args.repeats}: route {last['route_ours']:,.0f}/s vs regex "
                f"loop {last['route_anchor']:,.0f}/s; send plain {last['send_plain']:,.0f}/s,"
                f" topic exchange {last['send_topic']:,.0f}/s, "
                f"fanout x3 {last['send_fanout3']:,.0f}/s"
            )
    m = runs.medians()
    return {
        "figure": "topic_routing_decisions_per_s_10k_bindings",
        "ours": round(m["route_ours"]),
        "anchor": round(m["route_anchor"], 1),
        "ratio": safe_ratio(m["route_ours"], m["route_anchor"], 1),
        "unit": "routing decisions/s (one thread)",
        "title": "Routing decisions, topic exchange with 10k bindings",
        "anchor_is": "a loop over every binding's compiled regex",
        "figures": [
            figure(
                "send_topic_exchange_per_s",
                round(m["send_topic"]),
                round(m["send_plain"]),
                unit="events/s",
                title="send() through a topic exchange (one target)",
                anchor_is="a plain send() to a topic",
            ),
        ],
        "send_fanout3_events_per_s": round(m["send_fanout3"]),
        "runs": {name: [round(v, 1) for v in values] for name, values in runs.values.items()},
        "settings": {
            "bindings": BINDINGS,
            "target_topics": TARGET_TOPICS,
            "binding_key_vocabularies": list(POSITIONS),
            "hash_tail_chance": HASH_TAIL_CHANCE,
            "star_chance": STAR_CHANCE,
            "max_stars": MAX_STARS,
            "routing_keys": ROUTING_KEYS,
            "anchor_keys_per_pass": anchor_keys,
            "route_pass_seconds": route_seconds,
            "payload_bytes": PAYLOAD_BYTES,
            "capacity_bytes_per_ring": CAPACITY_BYTES,
            "send_events_per_pass": send_events,
            "fanout_topics": len(FANOUT_TOPICS),
        },
        "trie_build_ms": trie_build_ms,
        "regex_compile_ms": regex_compile_ms,
        "targets_per_key_mean": targets_per_key,
        "unroutable_share": round(sum(1 for t in targets if not t) / len(targets), 4),
        **session.provenance(None, packages=()),
    }


if __name__ == "__main__":
    sys.exit(bench_main("Routing decisions/s with 10k bindings; send() through exchanges", run))
