"""AsyncClient against a real agent process: batching, errors, a killed agent, timeouts."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from eventspool import EventTooLargeError, InvalidEventError, InvalidTopicError
from eventspool.broker import LocalBroker
from eventspool.client.aio import AsyncClient
from eventspool.client.sync import AgentError, Client
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids, ledger
from tests.agent import conftest as agent_fixtures
from tests.agent.conftest import AgentFactory

# pytest collects fixtures from module attributes by attribute name: this brings the agent
# tests' fixture here (an import of the name would read as unused, then as redefined).
agent_factory = agent_fixtures.agent_factory

_T = TypeVar("_T")
TopicFactory = Callable[[int], str]


def run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Each test runs its own event loop: no asyncio plugin is needed."""
    return asyncio.run(coroutine)


def started(agent_factory: AgentFactory, extra: str = "") -> AgentProcess:
    agent = agent_factory(extra)
    agent.start()
    return agent


def assert_reached_kafka(broker: LocalBroker, topics: list[str], ids: list[str]) -> None:
    seen = consume_event_ids(broker.bootstrap_servers, topics, ids, timeout=60)
    assert ledger(ids, seen).lost == 0


# ---- batching ----------------------------------------------------------------------------


def test_a_thousand_concurrent_sends_reach_kafka_in_one_frame(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(3)
    agent = started(agent_factory)

    async def main() -> tuple[list[str], int, int]:
        async with AsyncClient(agent.socket_path) as client:
            ids = await asyncio.gather(
                *(client.send(topic, b"payload %d" % i, key=f"user-{i % 13}") for i in range(1000))
            )
            return ids, client.frames_sent, client.batches_sent

    ids, frames, batches = run(main())
    assert len(set(ids)) == 1000
    assert (frames, batches) == (1, 1)
    assert_reached_kafka(broker, [topic], ids)


def test_senders_in_a_loop_share_frames(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: TopicFactory
) -> None:
    """Each sender waits for its answer before the next send: answers arrive together,
    so the next sends go together too."""
    topic = topic_factory(2)
    agent = started(agent_factory)

    async def main() -> tuple[list[str], int]:
        ids: list[str] = []
        async with AsyncClient(agent.socket_path) as client:

            async def produce(worker: int) -> None:
                for i in range(50):
                    ids.append(await client.send(topic, b"%d-%d" % (worker, i), key=b"%d" % i))

            await asyncio.gather(*(produce(worker) for worker in range(20)))
            return ids, client.frames_sent

    ids, frames = run(main())
    assert len(set(ids)) == 1000
    assert frames <= 200, f"{frames} frames for 1000 sends"
    assert_reached_kafka(broker, [topic], ids)


def test_one_frame_per_topic_and_max_batch_splits_a_batch(
    agent_factory: AgentFactory, topic_factory: TopicFactory
) -> None:
    first, second = topic_factory(1), topic_factory(1)
    agent = started(agent_factory)

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            await asyncio.gather(
                *(client.send(first if i % 2 else second, b"%d" % i) for i in range(100))
            )
            assert (client.frames_sent, client.batches_sent) == (2, 1)
        async with AsyncClient(agent.socket_path, max_batch=100) as client:
            ids = await asyncio.gather(*(client.send(first, b"%d" % i) for i in range(250)))
            assert len(set(ids)) == 250
            assert (client.frames_sent, client.batches_sent) == (3, 3)

    run(main())


def test_one_publish_frame_per_exchange_beside_the_send_frames(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: TopicFactory
) -> None:
    plain, fanned = topic_factory(1), topic_factory(2)
    agent = started(
        agent_factory, f'[exchanges.fan]\ntype = "fanout"\nbindings = [{{topic = "{fanned}"}}]\n'
    )

    async def main() -> tuple[list[str], list[str]]:
        async with AsyncClient(agent.socket_path) as client:
            sends = [client.send(plain, b"%d" % i) for i in range(50)]
            publishes = [
                client.send(None, b"%d" % i, exchange="fan", routing_key=f"k.{i}")
                for i in range(50)
            ]
            ids = await asyncio.gather(*sends, *publishes)
            assert (client.frames_sent, client.batches_sent) == (2, 1)
            return ids[:50], ids[50:]

    sent, published = run(main())
    assert_reached_kafka(broker, [plain], sent)
    assert_reached_kafka(broker, [fanned], published)


def test_linger_combines_sends_issued_apart(agent_factory: AgentFactory) -> None:
    agent = started(agent_factory)

    async def main() -> None:
        async with AsyncClient(agent.socket_path, linger_s=0.2) as client:

            async def late(delay: float) -> str:
                await asyncio.sleep(delay)
                return await client.send("fine", b"x")

            await asyncio.gather(late(0), late(0.05), late(0.1))
            assert client.frames_sent == 1

    run(main())


def test_frames_stay_under_the_agents_maximum(agent_factory: AgentFactory) -> None:
    """Twenty 60 kB events are 1.2 MB: one frame would be refused by this agent."""
    agent = started(agent_factory, "max_frame_bytes = 200000")
    values = [bytes([i]) * 60_000 for i in range(20)]

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            client.max_frame_bytes = 200_000
            ids = await asyncio.gather(*(client.send("fine", value) for value in values))
            assert len(set(ids)) == 20
            assert client.frames_sent >= 7
        async with AsyncClient(agent.socket_path) as client:  # the control: one big frame
            outcomes = await asyncio.gather(
                *(client.send("fine", value) for value in values), return_exceptions=True
            )
            # The agent answers ERROR and hangs up; whether the client reads the refusal or
            # first fails to write the rest of the frame is a race: both are AgentError.
            assert all(isinstance(outcome, AgentError) for outcome in outcomes), outcomes
            assert all("outcome is unknown" in str(outcome) for outcome in outcomes)
            assert len(await client.send("fine", b"the next connection works")) == 36

    run(main())


def test_frame_size_accounting_is_exact(agent_factory: AgentFactory) -> None:
    """Three events whose SEND frame is exactly the agent's maximum: accepted whole. The
    same plus one byte, with a client that believes the maximum is one byte larger: the
    agent refuses it. Keys, headers and null header values all count."""
    agent = started(agent_factory, "max_frame_bytes = 200000")
    # Frame length = 11 + topic "fine" (4) + (v1 + 23) + (v2 + 10) + (v3 + 5).
    sizes = (66_649, 66_649, 66_649)

    def sends(client: AsyncClient, extra: int) -> list[Coroutine[Any, Any, str]]:
        v1, v2, v3 = sizes
        return [
            client.send("fine", b"1" * v1, headers=[("h", b"vv"), ("n", None)]),
            client.send("fine", b"2" * v2, key=b"k"),
            client.send("fine", b"3" * (v3 + extra)),
        ]

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            client.max_frame_bytes = 200_000
            assert all(len(event_id) == 36 for event_id in await asyncio.gather(*sends(client, 0)))
            assert client.frames_sent == 1
            await asyncio.gather(*sends(client, 1))
            assert client.frames_sent == 3  # one byte over: split in two
        async with AsyncClient(agent.socket_path) as client:
            client.max_frame_bytes = 200_001
            outcomes = await asyncio.gather(*sends(client, 1), return_exceptions=True)
            assert all(isinstance(outcome, AgentError) for outcome in outcomes), outcomes

    run(main())


# ---- errors -----------------------------------------------------------------------------

BadArguments = tuple[Any, Any, Any, Any, type[Exception]]  # topic, value, key, headers, error
BAD_ARGUMENTS: dict[str, BadArguments] = {
    "topic with a space": ("no spaces allowed", b"x", None, None, InvalidTopicError),
    "empty topic": ("", b"x", None, None, InvalidTopicError),
    "too large": ("fine", b"x" * 200_000, None, None, EventTooLargeError),
    "str value": ("fine", "text, not bytes", None, None, InvalidEventError),
    "bytearray value": ("fine", bytearray(b"x"), None, None, InvalidEventError),
    "int header value": ("fine", b"x", None, {"h": 5}, InvalidEventError),
    "str headers": ("fine", b"x", None, "not headers", InvalidEventError),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_errors_are_those_of_the_blocking_client(
    agent_factory: AgentFactory, case: BadArguments
) -> None:
    topic, value, key, headers, error = case
    agent = started(agent_factory)
    with Client(agent.socket_path) as client, pytest.raises(error) as blocking:
        client.send(topic, value, key, headers)

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            with pytest.raises(error) as asynchronous:
                await client.send(topic, value, key, headers)
            assert type(asynchronous.value) is type(blocking.value)
            assert str(asynchronous.value) == str(blocking.value)
            assert len(await client.send("fine", b"still works")) == 36

    run(main())


def test_a_bad_event_fails_alone_in_its_batch(agent_factory: AgentFactory) -> None:
    agent = started(agent_factory)

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            outcomes = await asyncio.gather(
                client.send("fine", b"a"),
                client.send("fine", b"x" * 200_000),
                client.send("bad topic", b"b"),
                client.send("fine", b"c", key=7),  # type: ignore[arg-type]
                client.send("fine", b"d", headers=[("h", b"v")]),
                return_exceptions=True,
            )
            assert client.frames_sent == 1
        good_a, too_large, bad_topic, bad_key, good_d = outcomes
        assert isinstance(good_a, str)
        assert isinstance(good_d, str)
        assert isinstance(too_large, EventTooLargeError)
        assert isinstance(bad_topic, InvalidTopicError)
        assert isinstance(bad_key, InvalidEventError)

    run(main())


@pytest.mark.parametrize(
    ("topic", "key", "error"),
    [
        (None, None, InvalidTopicError),
        ("x" * 70_000, None, InvalidTopicError),
        ("caf\u00e9", None, InvalidTopicError),
        ("fine", 7, InvalidEventError),
        ("fine", "\udc80", InvalidEventError),
    ],
)
def test_arguments_the_wire_cannot_carry_fail_before_connecting(
    tmp_path: Path, topic: Any, key: Any, error: type[Exception]
) -> None:
    """As `Spool.send()` raises them; nothing is written, not even a connection made."""

    async def main() -> None:
        client = AsyncClient(tmp_path / "nobody.sock", timeout=0.2)
        with pytest.raises(error):
            await client.send(topic, b"x", key)
        assert client.frames_sent == 0
        await client.close()

    run(main())


def test_constructor_rejects_nonsense(tmp_path: Path) -> None:
    cases: list[dict[str, Any]] = [
        {"timeout": 0},
        {"max_batch": 0},
        {"linger_s": -1},
        {"reconnect_backoff_s": 0},
    ]
    for kwargs in cases:
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            AsyncClient(tmp_path / "agent.sock", **kwargs)


# ---- a dying agent -------------------------------------------------------------------------


def test_killed_agent_fails_in_flight_sends_and_later_sends_reconnect(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: TopicFactory
) -> None:
    """SIGSTOP first, so that the sends are surely written and unanswered when SIGKILL lands."""
    topic = topic_factory(2)
    agent = started(agent_factory)
    assert agent.process is not None
    process = agent.process

    async def main() -> list[str]:
        async with AsyncClient(agent.socket_path, timeout=30) as client:
            before = await client.send(topic, b"before")
            agent.freeze()
            try:
                in_flight = [
                    asyncio.create_task(client.send(topic, b"in flight %d" % i)) for i in range(50)
                ]
                while client.frames_sent < 2:
                    await asyncio.sleep(0.01)
                process.kill()
                await asyncio.to_thread(process.wait)
            finally:
                if process.poll() is None:
                    agent.thaw()
            outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
            for outcome in outcomes:
                assert isinstance(outcome, AgentError), outcome
                assert "outcome is unknown" in str(outcome)

            # Sends issued while the agent is down wait for it, then go out on a new connection.
            waiting = [asyncio.create_task(client.send(topic, b"after %d" % i)) for i in range(20)]
            await asyncio.sleep(0.5)
            assert not any(task.done() for task in waiting)
            await asyncio.to_thread(agent.start)
            after = await asyncio.gather(*waiting)
            later = await client.send(topic, b"later")
            assert await client.ping() < 5.0
            return [before, *after, later]

    ids = run(main())
    assert len(set(ids)) == 22
    assert_reached_kafka(broker, [topic], ids)


def test_sends_under_load_survive_a_kill(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: TopicFactory
) -> None:
    """The kill lands wherever it lands: every send returns an id or raises AgentError,
    and every returned id reaches Kafka."""
    topic = topic_factory(3)
    agent = started(agent_factory)
    assert agent.process is not None
    process = agent.process

    async def main() -> tuple[list[str], list[BaseException]]:
        ids: list[str] = []
        failures: list[BaseException] = []
        stop = asyncio.Event()
        async with AsyncClient(agent.socket_path, timeout=30) as client:

            async def produce(worker: int) -> None:
                i = 0
                while not stop.is_set():
                    i += 1
                    try:
                        ids.append(await client.send(topic, b"%d-%d" % (worker, i), key=b"%d" % i))
                    except AgentError as exc:
                        failures.append(exc)

            async def until(count: int) -> None:
                while len(ids) < count:
                    await asyncio.sleep(0.01)

            workers = [asyncio.create_task(produce(worker)) for worker in range(20)]
            await asyncio.wait_for(until(500), 30)
            process.kill()
            await asyncio.to_thread(process.wait)
            await asyncio.to_thread(agent.start)
            killed_at = len(ids)
            await asyncio.wait_for(until(killed_at + 500), 30)
            stop.set()
            await asyncio.gather(*workers)
        return ids, failures

    ids, failures = run(main())
    assert len(set(ids)) == len(ids)
    assert all("outcome is unknown" in str(failure) for failure in failures), failures[:3]
    assert_reached_kafka(broker, [topic], ids)


# ---- timeouts, ping, stats, close ----------------------------------------------------------


def test_an_unreachable_agent_times_out(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncClient(tmp_path / "nobody.sock", timeout=0.3) as client:
            for call in (client.send("topic", b"x"), client.ping(), client.stats()):
                began = time.monotonic()
                with pytest.raises(AgentError, match="cannot connect"):
                    await call
                assert 0.3 <= time.monotonic() - began < 5.0  # upper bound: a busy machine
            assert client.frames_sent == 0

    run(main())


def test_a_frozen_agent_times_out_and_the_client_recovers(agent_factory: AgentFactory) -> None:
    agent = started(agent_factory)

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            await client.send("fine", b"warm")
            client.timeout = 0.5  # short only while frozen: the rest may meet a busy machine
            agent.freeze()
            try:
                began = time.monotonic()
                with pytest.raises(AgentError, match="no answer within"):
                    await client.send("fine", b"frozen")
                assert time.monotonic() - began < 5.0  # generous: a busy machine
            finally:
                agent.thaw()
            client.timeout = 10.0
            assert len(await client.send("fine", b"thawed")) == 36  # late answers are ignored

    run(main())


def test_ping_and_stats(agent_factory: AgentFactory) -> None:
    agent = started(agent_factory)

    async def main() -> None:
        async with AsyncClient(agent.socket_path) as client:
            assert 0 < await client.ping() < 5.0
            await client.send("fine", b"x")
            stats = await client.stats()
            assert "fine" in {queue["topic"] for queue in stats["queues"]}
            assert stats["protocol_errors"] == 0
            rtt, answer = await asyncio.gather(client.ping(), client.send("fine", b"y"))
            assert rtt < 5.0
            assert len(answer) == 36

    run(main())


def test_close_lets_issued_sends_finish_then_refuses_more(agent_factory: AgentFactory) -> None:
    agent = started(agent_factory)

    async def main() -> None:
        client = AsyncClient(agent.socket_path)
        tasks = [asyncio.create_task(client.send("fine", b"%d" % i)) for i in range(100)]
        await asyncio.sleep(0)
        await client.close()
        assert all(len(task.result()) == 36 for task in tasks)
        with pytest.raises(AgentError, match="closed"):
            await client.send("fine", b"too late")
        await client.close()

    run(main())


def test_a_cancelled_send_is_not_written(agent_factory: AgentFactory) -> None:
    agent = started(agent_factory)

    async def main() -> None:
        async with AsyncClient(agent.socket_path, linger_s=0.2) as client:
            task = asyncio.create_task(client.send("fine", b"never"))
            await asyncio.sleep(0.05)
            task.cancel()
            kept = await client.send("fine", b"kept")
            assert len(kept) == 36
            assert client.frames_sent == 1
            stats = await client.stats()
            assert sum(queue["next_seq"] for queue in stats["queues"]) == 1

    run(main())


def test_close_does_not_hang_on_a_frozen_agent(agent_factory: AgentFactory) -> None:
    """Megabytes the frozen agent never reads: the writer waits in drain(), close() must not."""
    agent = started(agent_factory)

    async def main() -> None:
        client = AsyncClient(agent.socket_path)
        await client.send("fine", b"warm")
        client.timeout = 0.5
        agent.freeze()
        try:
            sends = [asyncio.create_task(client.send("fine", b"x" * 60_000)) for _ in range(100)]
            await asyncio.sleep(0.1)
            began = time.monotonic()
            await client.close()
            assert time.monotonic() - began < 5.0  # generous: a busy machine
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            assert all(isinstance(outcome, AgentError) for outcome in outcomes)
        finally:
            agent.thaw()

    run(main())


# ---- send_many -------------------------------------------------------------------------


def test_send_many_answers_each_event_in_order(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: TopicFactory
) -> None:
    topic = topic_factory(2)
    agent = started(agent_factory)

    chosen = str(uuid.uuid4())

    async def main() -> list[object]:
        async with AsyncClient(agent.socket_path) as client:
            return [
                *await client.send_many(
                    topic, [b"plain", (b"keyed", "user-1"), (b"x" * 200_000, None), None]
                ),
                await client.send(topic, b"with its own id", event_id=chosen),
            ]

    outcomes = run(main())
    assert isinstance(outcomes[2], EventTooLargeError)
    assert outcomes[-1] == chosen
    ids = [outcome for outcome in outcomes if isinstance(outcome, str)]
    assert len(ids) == 4
    assert_reached_kafka(broker, [topic], ids)
