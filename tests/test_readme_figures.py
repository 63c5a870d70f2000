"""Each benchmark figure the README quotes is the one docs/benchmarks.json holds.

`make report` rewrites docs/benchmarks.json and docs/benchmarks.md; the README's
sentences are written by hand, so each figure they quote is listed here with the place
in the report's data it comes from. A new report that moves a figure fails this test
until the README says the new value, and a figure quoted twice cannot say two things.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DATA = REPO / "docs" / "benchmarks.json"

# (a sentence of the README with {} for each figure, the bench, then per {} where its
# value is in that bench's result and how the README writes it). A path starts with a
# figure's name (the result's own or one of its `figures`) or a key of the result.
QUOTED: list[tuple[str, str, list[str]]] = [
    (
        "[{} lost per SIGKILL, against a bare producer's median of {}]",
        "kill_loss",
        [
            "sigkill_acknowledged_events_lost_per_kill.ours:,.0f",
            "sigkill_acknowledged_events_lost_per_kill.anchor:,.0f",
        ],
    ),
    (
        "`Spool.send()` lost {} acknowledged events per kill; a bare confluent-kafka "
        "`Producer` (acks=all, idempotent) lost a median of {} events",
        "kill_loss",
        [
            "sigkill_acknowledged_events_lost_per_kill.ours:,.0f",
            "sigkill_acknowledged_events_lost_per_kill.anchor:,.0f",
        ],
    ),
    (
        "acknowledging fewer per second than the spool ({} against {})",
        "kill_loss",
        [
            "acknowledged_rate_vs_bare_producer.anchor:,.0f",
            "acknowledged_rate_vs_bare_producer.ours:,.0f",
        ],
    ),
    (
        "that producer acknowledges {} events/s",
        "kill_loss",
        ["acknowledged_rate_vs_producer_waiting_for_each_delivery.anchor:,.0f"],
    ),
    (
        "SIGKILL of the local shipper, {} times: the eventspool agent lost {} of {} "
        "acknowledged events; rsyslog with omkafka and a disk-assisted queue lost {} of {}",
        "log_shipper",
        [
            "sigkill.totals.ours.kills:d",
            "sigkill.totals.ours.lost:,d",
            "sigkill.totals.ours.acknowledged:,d",
            "sigkill.totals.anchor.lost:,d",
            "sigkill.totals.anchor.acknowledged:,d",
        ],
    ),
    (
        "{} events acknowledged, {} lost in Kafka",
        "soak",
        ["ledger.acknowledged_events:,d", "ledger.lost:,d"],
    ),
    (
        "a bare producer killed with the agent lost {} of its {}",
        "soak",
        ["anchor_ledger.lost:,d", "anchor_ledger.sent:,d"],
    ),
    (
        "cost `Spool.send()` {} acknowledged events and a bare idempotent producer {} that",
        "failover",
        [
            "failover_sigkill_acknowledged_events_lost_per_kill.ours:,.0f",
            "failover_sigkill_acknowledged_events_lost_per_kill.anchor:,.0f",
        ],
    ),
    (
        "the same for the failover ({} s at most)",
        "failover",
        ["failover_outage_stall_s.ours:.2f"],
    ),
    (
        "the p99 from send to acknowledgement was {} ms against {}",
        "failover",
        ["failover_p99_send_to_ack_ms.ours:.0f", "failover_p99_send_to_ack_ms.anchor:.0f"],
    ),
    (
        "`Spool.send()` returns in {} us at p99: {} events/s on one thread, {} times",
        "enqueue",
        [
            "enqueue_p99_process_1thread.ours:.2f",
            "enqueue_rate_process_1thread.ours:,d",
            "enqueue_rate_process_1thread.ratio:.1f",
        ],
    ),
    (
        "from 4 threads, keyed, {} events/s ({} times)",
        "enqueue",
        [
            "enqueue_rate_process_keyed_4threads.ours:,d",
            "enqueue_rate_process_keyed_4threads.ratio:.1f",
        ],
    ),
    (
        "With durability `fsync`, p99 is {} us against {} us",
        "enqueue",
        ["enqueue_p99_fsync_1thread.ours:.0f", "enqueue_p99_fsync_1thread.anchor:.0f"],
    ),
    (
        "{} instructions per send against {} per `produce()`",
        "enqueue",
        [
            "enqueue_instructions_per_event.ours:,.0f",
            "enqueue_instructions_per_event.anchor:,.0f",
        ],
    ),
    (
        "To the broker's acknowledgement: {} events/s, against {} for a bare idempotent "
        "producer ({})",
        "e2e",
        [
            "e2e_rate_keyed_12p.ours:,d",
            "e2e_rate_keyed_12p.anchor:,d",
            "e2e_rate_keyed_12p.ratio:.2f",
        ],
    ),
    (
        "{} events per produce request against its {}",
        "e2e",
        [
            "e2e_events_per_produce_request.ours:,.0f",
            "e2e_events_per_produce_request.anchor:,.0f",
        ],
    ),
    (
        "{} events/s with the blocking `send()`",
        "uds",
        ["uds_rate_one_batching_client.ours:,d"],
    ),
    (
        "{} hand-offs/s here with no I/O at all), {} with `send_async()`",
        "uds",
        ["uds_rate_send_async_one_client.anchor:,d", "uds_rate_send_async_one_client.ours:,d"],
    ),
    (
        "wait while one thread writes each batch reach {} events/s: the client stands at {} "
        "of that",
        "uds",
        [
            "uds_rate_one_client_vs_bare_client.anchor:,d",
            "uds_rate_one_client_vs_bare_client.ratio:.2f",
        ],
    ),
    (
        "This machine's floor for the lane is {} events/s, {} of the hand-off rate",
        "uds",
        [
            "uds_rate_one_client_vs_shipping_floor.anchor:,d",
            "shipping_floor_over_ceiling:.2f",
        ],
    ),
    (
        "on the same two cores. The client stands at {} of it.",
        "uds",
        ["uds_rate_one_client_vs_shipping_floor.ratio:.2f"],
    ),
    (
        "16 single-threaded caller processes reach {} of the rate of the same processes against it",
        "uds",
        ["processes_16_over_echo:.2f"],
    ),
    (
        "Their floor here, the same round trips while a bare producer ships as many events/s "
        "as they reached, is {} of that rate, and they stand at {} of it.",
        "uds",
        [
            "processes_16_shipping_floor_over_echo:.2f",
            "uds_rate_16_processes_vs_shipping_floor.ratio:.2f",
        ],
    ),
    (
        "The agent spends {} us of CPU per blocking event, where the echo server's {} per "
        "round trip and a bare producer's {} per event make a floor of {}",
        "uds",
        [
            "uds_agent_cpu_per_blocking_event.ours:.3g",
            "echo_server_cpu_us_per_event:.2g",
            "producer_cpu_us_per_event:.2g",
            "agent_cpu_floor_us_per_event:.2g",
        ],
    ),
    (
        "the agent ships {} times as many events into Kafka as rsyslog ({} against {} events/s",
        "log_shipper",
        [
            "agent_e2e_rate_vs_rsyslog.ratio:.2f",
            "agent_e2e_rate_vs_rsyslog.ours:,d",
            "agent_e2e_rate_vs_rsyslog.anchor:,d",
        ],
    ),
    (
        "spends {} us of CPU per event against rsyslog's {}",
        "log_shipper",
        ["shipper_cpu_us_per_event.ours:.3g", "shipper_cpu_us_per_event.anchor:.3g"],
    ),
    (
        "The consumer: {} events/s with a no-op handler, against {} for a bare consume loop "
        "in the same run ({}",
        "consumer",
        [
            "consumer_noop_events_per_s.ours:,d",
            "consumer_noop_events_per_s.anchor:,d",
            "consumer_noop_events_per_s.ratio:.2f",
        ],
    ),
    (
        "A CPU-bound handler runs {} times faster on 2 workers than on 1",
        "consumer",
        ["consumer_cpu_1ms_2_workers.ratio:.2f"],
    ),
    (
        "reaches {} events/s, {} of the {} its",
        "consumer",
        [
            "consumer_async_io_10ms.ours:,d",
            "consumer_async_io_10ms.ratio:.2f",
            "consumer_async_io_10ms.anchor:,d",
        ],
    ),
    (
        "writes {} times as many records as a `FileHandler` with the same formatter "
        "({} times from 4 threads)",
        "logging_handler",
        ["logging_handler_rate.ratio:.2f", "logging_handler_rate_4_threads.ratio:.1f"],
    ),
    (
        "10,000 bindings is {} times faster than a loop",
        "routing",
        ["topic_routing_decisions_per_s_10k_bindings.ratio:.0f"],
    ),
    (
        "the Spark source reads {} times as fast as a bare consumer",
        "spark_source",
        ["spark_source_read_rate.ratio:.2f"],
    ),
]


def _results() -> dict[str, dict[str, Any]]:
    return {entry["script"]: entry["result"] for entry in json.loads(DATA.read_text())["scripts"]}


def _value(result: dict[str, Any], path: str) -> Any:
    first, *rest = path.split(".")
    figures = {figure["figure"]: figure for figure in [result, *result.get("figures", [])]}
    value: Any = figures[first] if first in figures else result[first]
    for key in rest:
        value = value[key]
    return value


def _expected(sentence: str, bench: str, paths: list[str]) -> str:
    result = _results()[bench]
    values = []
    for spec in paths:
        path, _, form = spec.partition(":")
        values.append(format(_value(result, path), form))
    return sentence.format(*values)


@pytest.mark.parametrize(
    ("sentence", "bench", "paths"), QUOTED, ids=[f"{q[1]}-{i}" for i, q in enumerate(QUOTED)]
)
def test_the_readme_quotes_the_report(sentence: str, bench: str, paths: list[str]) -> None:
    readme = " ".join(README.read_text().split())
    expected = _expected(sentence, bench, paths)
    if expected not in readme:
        # Show what the README says instead: the sentence with its figures as a pattern.
        parts = [re.escape(part) for part in sentence.split("{}")]
        found = re.search(r"[\d.,]+".join(parts), readme)
        said = found.group(0) if found else "(the sentence itself is gone)"
        pytest.fail(f"docs/benchmarks.json says: {expected}\nREADME.md says: {said}")
