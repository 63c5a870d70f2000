"""The failover bench's own logic: the stream, the fault layout, acknowledgement times from
ring heads, the figures of a run and of a kill, and the result's orientation."""

from __future__ import annotations

import threading
import time

import pytest

from failover import (
    BROKERS,
    BURST_S,
    DOWN_BROKER,
    INITIAL_LEADERS,
    KEYS,
    MOVED_LEADERS,
    OUTAGE_LEADERS,
    PARTITIONS,
    PAYLOAD_BYTES,
    FaultTimes,
    KillFigures,
    Phases,
    RunFigures,
    ack_times_from_heads,
    backlog_at,
    build_result,
    down_at,
    longest_wait_s,
    paced,
    run_figures,
    settle_s,
    value_of,
)
from harness.figures import figures_of
from harness.ledger import delivered_fraction, lost_ratio

MS = 1_000_000


def test_values_are_fixed_size_distinct_json_like_text() -> None:
    values = [value_of(i) for i in (0, 1, 9_999, 10_000, 123_456_789)]
    assert {len(v) for v in values} == {PAYLOAD_BYTES}
    assert len(set(values)) == len(values)
    assert all(v.startswith(b'{"u":') and v.endswith(b'"}') for v in values)
    assert KEYS[0] == b"user-0" and KEYS[-1] == b"user-9999"


def test_every_leader_moves_and_the_down_brokers_partitions_go_to_live_brokers() -> None:
    first, moved, outage = INITIAL_LEADERS, MOVED_LEADERS, OUTAGE_LEADERS
    assert set(first) == set(moved) == set(range(PARTITIONS))
    assert set(first.values()) == set(moved.values()) == set(range(1, BROKERS + 1))
    assert all(first[p] != moved[p] for p in range(PARTITIONS))
    assert set(outage) == {p for p in range(PARTITIONS) if moved[p] == DOWN_BROKER}
    assert set(outage.values()) == set(range(1, BROKERS + 1)) - {DOWN_BROKER}


def test_the_broker_goes_down_at_the_asked_phase_of_the_clients_second() -> None:
    second = 1_000_000_000
    assert down_at(2 * second, 300 * MS, 0.5) == 2_800 * MS
    assert down_at(2_800 * MS, 300 * MS, 0.5) == 2_800 * MS
    assert down_at(2_801 * MS, 300 * MS, 0.5) == 3_800 * MS
    assert down_at(350 * MS, 300 * MS, 0.1) == 400 * MS
    assert FaultTimes(0, 3_850 * MS, 0, 300 * MS).down_phase_s == pytest.approx(0.55)


def test_ack_times_come_from_the_first_head_read_past_each_event() -> None:
    # Ring 0 starts at sequence 10, ring 1 at 0; events alternate between them.
    partitions = [0, 1, 0, 1, 0]
    logs = {
        0: ([100, 105, 120], [10, 12, 13]),  # 10 and 11 acknowledged at 105, 12 at 120
        1: ([100, 130], [0, 1]),  # 0 at 130; 1 never
    }
    acks = ack_times_from_heads(partitions, {0: 10, 1: 0}, logs)
    assert list(acks) == [105, 130, 105, -1, 120]


def test_settle_and_backlog_count_what_was_sent_before_the_moment() -> None:
    send = [0, 10, 20, 30]
    acks = [5, 40, 25, 31]
    assert settle_s(send, acks, 15) == pytest.approx(25e-9)  # event 1, acknowledged at 40
    assert settle_s(send, acks, 100) == 0.0
    assert backlog_at(send, acks, 15) == 1
    assert backlog_at(send, acks, 22) == 2
    with pytest.raises(ValueError, match="never acknowledged"):
        settle_s(send, [5, -1, 25, 31], 15)
    assert longest_wait_s(send, acks, 10, 30) == pytest.approx(30e-9)  # event 1 of 1 and 2
    assert longest_wait_s(send, acks, 31, 99) == 0.0


def test_a_runs_figures() -> None:
    send = [i * MS for i in range(100)]
    acks = [t + (500 * MS if i == 50 else 5 * MS) for i, t in enumerate(send)]
    faults = FaultTimes(moved=10 * MS, down=51 * MS, up=60 * MS, client_started=-MS)
    run = run_figures(send, acks, faults)
    assert run["events"] == 100
    assert run["p50_ack_ms"] == pytest.approx(5.0)
    assert run["max_ack_ms"] == pytest.approx(500.0)
    assert run["recovery_s"] == pytest.approx(0.49)  # event 50 is acknowledged at 550 ms
    assert run["broker_down_settle_s"] == pytest.approx(0.499)  # event 50 again
    assert run["leader_move_settle_s"] == pytest.approx(0.004)
    assert run["backlog_at_up"] == 5  # 50, and 56..59 still within their 5 ms
    assert run["outage_stall_s"] == pytest.approx(0.005)  # 51..59: event 50 came before
    assert faults.down_phase_s == pytest.approx(0.052)
    with pytest.raises(RuntimeError, match="1 events never acknowledged"):
        run_figures(send, [*acks[:-1], -1], faults)


def test_pacing_keeps_to_the_clock_when_idle_returns_early() -> None:
    stop = threading.Event()
    bursts: list[tuple[int, int, float]] = []

    def burst(start: int, stop_at: int) -> None:
        bursts.append((start, stop_at, time.monotonic()))
        if len(bursts) == 5:
            stop.set()

    def idle(_seconds: float) -> None:
        time.sleep(0.0001)  # as poll() does when it served a delivery report at once

    sent = paced(20_000, stop, burst, idle, 7)
    assert sent == 500
    assert [(a, b) for a, b, _ in bursts] == [(7 + 100 * i, 107 + 100 * i) for i in range(5)]
    assert bursts[-1][2] - bursts[0][2] >= 4 * BURST_S * 0.99


def _run(recovery: float, p99: float) -> RunFigures:
    return {"recovery_s": recovery, "p99_ack_ms": p99, "outage_stall_s": 0.9, "events": 1000}


def _kill(side: str, lost: int, delivered_lost: int | None) -> KillFigures:
    delivered = None if delivered_lost is None else 1000
    tally = (1000, 1000 - lost, lost, 0, 0)
    return KillFigures(*tally, side, 0, 0.5, 2.5, delivered, delivered_lost, 1000, None)


def test_the_result_is_ahead_above_one_and_reads_as_figures() -> None:
    runs = {
        "ours": [_run(0.010, 300.0), _run(0.014, 200.0)],
        "anchor": [_run(0.005, 600.0), _run(0.007, 500.0)],
    }
    kills = [_kill("ours", 0, None), _kill("anchor", 99, 0)]
    phases = Phases(steady_s=1.0, outage_s=5.0, tail_s=2.0, kill_after_down_s=2.5)
    result = build_result(runs, kills, phases, {})
    assert list(result)[:4] == ["figure", "ours", "anchor", "ratio"]
    assert (result["ours"], result["anchor"], result["ratio"]) == (0.012, 0.006, 0.5)
    by_name = {f.name: f for f in figures_of("failover", result)}
    assert by_name["failover_p99_send_to_ack_ms"].ratio == 2.2  # anchor 550 / ours 250
    assert by_name["failover_outage_stall_s"].ratio == 1.0
    lost = by_name["failover_sigkill_acknowledged_events_lost_per_kill"]
    assert (lost.ours, lost.anchor, lost.ratio) == (0.0, 99.0, 100.0)
    assert lost.random_anchor
    assert result["lost_per_kill"] == {
        "ours_send_returned": 0.0,
        "anchor_produce_returned": 99.0,
        "anchor_delivery_acknowledged": 0.0,
    }
    assert lost_ratio(0, 0) == 1.0


def test_nothing_acknowledged_is_nothing_lost() -> None:
    assert delivered_fraction(0, 0) == 1.0
    assert delivered_fraction(2, 3) == pytest.approx(2 / 3)
