"""The `eventspool status` table, from two STATS answers taken `interval` seconds apart."""

from __future__ import annotations

from typing import Any

_COLUMNS = ("QUEUE", "DEPTH", "OLDEST", "IN/S", "OUT/S", "DROPPED", "SKIPPED", "FILES")
_MIB = 1024 * 1024


def _budget_line(budget: dict[str, Any]) -> str:
    """Disk budget: used / limit (percent), topics, refusals."""
    used, limit = budget["used_bytes"], budget["max_bytes"]
    share = f" ({100 * used / limit:.0f}%)" if limit else ""
    topics = f"{budget['topics']}" + (f" of {budget['max_topics']}" if budget["max_topics"] else "")
    return (
        f"disk budget: {used / _MIB:.0f} MiB of "
        f"{'no limit' if not limit else f'{limit / _MIB:.0f} MiB'}{share}   topics: {topics}   "
        f"refused: {budget['refusals']}"
    )


def _files(queue: dict[str, Any]) -> str:
    """Disk taken by the queue's segment files, and how many there are."""
    count = queue["segments"]
    return f"{queue['allocated_bytes'] / _MIB:.1f} MiB in {count} segment{'s' * (count != 1)}"


def render_status(before: dict[str, Any], after: dict[str, Any], interval: float) -> str:
    earlier = {(q["topic"], q["partition"]): q for q in before.get("queues", [])}
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for queue in sorted(after.get("queues", []), key=lambda q: (q["topic"], str(q["partition"]))):
        old = earlier.get((queue["topic"], queue["partition"]), queue)
        sent_in = (queue["next_seq"] - old["next_seq"]) / interval
        acked_out = (queue["head_seq"] - old["head_seq"]) / interval
        partition = "pending" if queue["partition"] is None else queue["partition"]
        age = queue["oldest_age_ms"]
        rows.append(
            (
                f"{queue['topic']}/{partition}",
                str(queue["depth"]),
                "-" if age is None else f"{age / 1000:.1f}s",
                f"{sent_in:.0f}",
                f"{acked_out:.0f}",
                str(queue["dropped"]),
                str(queue["skipped_total"]),
                _files(queue),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    table = "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    )
    sender = after.get("sender") or {}
    broker = "connected" if after.get("broker_connected") else "NOT CONNECTED"
    summary = (
        f"broker: {broker}   dead letters: {after.get('dead_letters', 0)}   "
        f"delivered: {sender.get('delivered', 0)}   retried batches: "
        f"{sender.get('retried_batches', 0)}   last error: {sender.get('last_error') or '-'}"
    )
    for queue in after.get("stalled") or []:
        partition = "pending" if queue["partition"] is None else queue["partition"]
        summary += (
            f"\nSTALLED: {queue['topic']}/{partition} holds {queue['depth']} events and has "
            f"not advanced for {queue['stalled_s']:.0f} s"
        )
    for topic, problems in sorted((after.get("topic_warnings") or {}).items()):
        summary += f"\nWARNING: topic {topic} may lose acknowledged events: {'; '.join(problems)}"
    budget = after.get("budget")
    if budget:
        summary += "\n" + _budget_line(budget)
    return f"{summary}\n{table}" if len(rows) > 1 else f"{summary}\nno queues yet"
