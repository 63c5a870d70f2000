"""The main job: embedded broker, spool and sender, a business-event producer, a verifier.

It shows the whole promise in one run: `send()` returns at once, every event reaches
Kafka, and the verifier proves it by event id.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import click

from eventspool.broker import LocalBroker
from eventspool.spool.api import Spool
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
def main(rate: int, seconds: float, seed: int, workdir: Path | None) -> None:
    """Run the pipeline end to end on the embedded broker and verify nothing is lost."""
    root = workdir or Path(tempfile.mkdtemp(prefix="eventspool-demo-"))
    root.mkdir(parents=True, exist_ok=True)
    click.echo(f"work directory: {root}")
    with LocalBroker(root / "broker") as broker:
        click.echo(f"embedded broker on {broker.bootstrap_servers}")
        sent = _produce(root / "spool", broker.bootstrap_servers, rate, seconds, seed)
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


def _produce(directory: Path, bootstrap: str, rate: int, seconds: float, seed: int) -> list[str]:
    rng = random.Random(seed)
    sent: list[str] = []
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
            sent.append(spool.send(topic, json.dumps(body).encode(), key=user))
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
