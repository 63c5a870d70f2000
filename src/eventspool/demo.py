"""The main job: embedded broker, spool and sender, a business-event producer, a verifier,
then the Spark pipeline over the same events.

It shows the whole promise in one run: `send()` returns at once, every event reaches
Kafka, the verifier proves it by event id, and the pipeline archives each event once and
computes statistics and rewards whose totals match what was sent.
"""

from __future__ import annotations

import contextlib
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

import click

from eventspool.broker import LocalBroker
from eventspool.pipeline import Spool
from eventspool.spark.jobs.rules import DEFAULT_RULES, daily_rewards
from eventspool.spark.jobs.runner import PipelineConfig, describe, run
from eventspool.spark.pgserver import LocalPostgres
from eventspool.spark.session import build_session
from eventspool.verify import consume_event_ids, ledger

TOPICS = ("orders", "payments", "page_views")
_PAGES = ("/", "/search", "/product/42", "/product/7", "/cart", "/checkout", "/account")


def business_event(rng: random.Random, sequence: int) -> tuple[str, str, dict[str, object]]:
    """One realistic event: (topic, user key, body). Orders lead to payments, users browse."""
    user = f"user-{rng.randrange(5000)}"
    kind = rng.random()
    if kind < 0.2:
        amount = rng.randrange(500, 25_000)
        status = "paid" if rng.random() < 0.8 else "pending"
        body: dict[str, object] = {
            "type": "order_created",
            "order_id": f"o-{sequence}",
            "user_id": user,
            "amount_cents": amount,
            "currency": "EUR",
            "status": status,
        }
        return "orders", user, body
    if kind < 0.35:
        body = {
            "type": "payment_captured",
            "payment_id": f"p-{sequence}",
            "order_id": f"o-{rng.randrange(max(1, sequence))}",
            "user_id": user,
            "amount_cents": rng.randrange(500, 25_000),
            "method": rng.choice(("card", "paypal", "sepa")),
        }
        return "payments", user, body
    body = {
        "type": "page_view",
        "user_id": user,
        "path": rng.choice(_PAGES),
        "referrer": rng.choice(("direct", "search", "ads", "email")),
    }
    return "page_views", user, body


@click.command()
@click.option("--rate", default=5000, show_default=True, help="Events per second to produce.")
@click.option("--seconds", default=10.0, show_default=True, help="How long to produce.")
@click.option("--seed", default=7, show_default=True, help="Seed of the event generator.")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the spool and broker log go  [default: a fresh temporary directory]",
)
@click.option(
    "--dsn",
    envvar="EVENTSPOOL_PG_DSN",
    help="An empty PostgreSQL database for the rewards  [default: a throwaway server]",
)
def main(rate: int, seconds: float, seed: int, workdir: Path | None, dsn: str | None) -> None:
    """Run the pipeline end to end on the embedded broker and verify nothing is lost."""
    root = workdir or Path(tempfile.mkdtemp(prefix="eventspool-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    click.echo(f"work directory: {root}")
    with LocalBroker(root / "broker") as broker:
        click.echo(f"embedded broker on {broker.bootstrap_servers}")
        bodies = _produce(root / "spool", broker.bootstrap_servers, rate, seconds, seed)
        sent = list(bodies)
        click.echo(f"verifying {len(sent)} events by event_id ...")
        seen = consume_event_ids(
            broker.bootstrap_servers,
            TOPICS,
            sent,
            timeout=120,
            progress=lambda n: click.echo(f"  read {n} distinct events", err=True),
        )
        result = ledger(sent, seen)
        click.echo(
            f"sent={result.sent} delivered={result.delivered} "
            f"lost={result.lost} duplicated={result.duplicated}"
        )
        if not result.ok:
            raise click.ClickException(f"{result.lost} acknowledged events were lost")
        click.echo("OK: lost = 0, every acknowledged event reached Kafka")
        _pipeline(root / "pipeline", broker.bootstrap_servers, bodies, dsn)


def _create_ms(event_id: str) -> int:
    """The create time in a UUIDv7 id: its first 48 bits, milliseconds since the epoch."""
    return int(event_id.replace("-", "")[:12], 16)


def _pipeline(
    output: Path, bootstrap: str, bodies: dict[str, dict[str, object]], dsn: str | None
) -> None:
    """Run the Spark pipeline over the demo's topics and check its totals."""
    click.echo("pipeline: Spark over the same events (archive, statistics, rewards) ...")
    with contextlib.ExitStack() as stack:
        if dsn is None:
            dsn = stack.enter_context(LocalPostgres()).dsn
            click.echo("  throwaway PostgreSQL started for the rewards table", err=True)
        spark = build_session("local[*]", "eventspool-demo")
        stack.callback(spark.stop)
        config = PipelineConfig(
            bootstrap_servers=bootstrap,
            output=output,
            checkpoint=output / "_checkpoint",
            dsn=dsn,
            topics=TOPICS,
        )
        summary = run(spark, config, once=True, progress=lambda line: click.echo(line, err=True))
    for line in describe(summary):
        click.echo(line)
    totals = summary.totals
    by_type = dict(Counter(str(body["type"]) for body in bodies.values()))
    rewards = sum(
        daily_rewards(((_create_ms(i), b) for i, b in bodies.items()), DEFAULT_RULES).values()
    )
    problems = [
        f"{name}: pipeline {got}, sent {want}"
        for name, got, want in (
            ("archived rows", totals.archived_rows, len(bodies)),
            ("distinct event ids", totals.distinct_event_ids, len(bodies)),
            ("events by type", totals.events_by_type, by_type),
            ("reward cents", totals.reward_cents, rewards),
        )
        if got != want
    ]
    if problems:
        raise click.ClickException("pipeline totals differ: " + "; ".join(problems))
    click.echo(
        f"OK: pipeline totals match what was sent: {len(bodies)} events, {rewards} reward cents"
    )


def _produce(
    directory: Path, bootstrap: str, rate: int, seconds: float, seed: int
) -> dict[str, dict[str, object]]:
    """Send the events; return each one's body by event id, in the order sent."""
    rng = random.Random(seed)
    sent: dict[str, dict[str, object]] = {}
    latencies: list[float] = []
    with Spool(directory, bootstrap) as spool:
        start = time.monotonic()
        next_report = start + 1
        total = int(rate * seconds)
        for sequence in range(total):
            due = start + sequence / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            topic, user, body = business_event(rng, sequence)
            began = time.perf_counter()
            sent[spool.send(topic, json.dumps(body).encode(), key=user)] = body
            latencies.append(time.perf_counter() - began)
            if time.monotonic() >= next_report:
                next_report += 1
                click.echo(
                    f"  sent {len(sent)}/{total}, unacknowledged {spool.unacknowledged()}",
                    err=True,
                )
        latencies.sort()
        p50 = latencies[len(latencies) // 2] * 1e6
        p99 = latencies[int(len(latencies) * 0.99)] * 1e6
        click.echo(
            f"produced {len(sent)} events; send() latency p50 {p50:.1f} us, p99 {p99:.1f} us"
        )
        remaining = spool.flush(60)
        click.echo(f"flushed: {remaining} events still unacknowledged")
    return sent


if __name__ == "__main__":
    main()
