"""The blocking Client: argument checks, pipelining, send_many() and send_async().

A bad argument must fail its own call: were it let through to the batch written for
every waiting thread, the others' sends would fail with it. Those errors come before any
connection, so no agent is needed; the rest run against a real agent.
"""

from __future__ import annotations

import enum
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any

import pytest

from eventspool import EventTooLargeError, InvalidEventError, InvalidTopicError
from eventspool.broker import LocalBroker
from eventspool.client.sync import AgentError, Client
from eventspool.client.sync_connection import Connection
from eventspool.verify import consume_event_ids, ledger
from eventspool.wire.checks import BatchEvent
from tests.agent import conftest as agent_fixtures
from tests.agent.conftest import AgentFactory

# pytest collects fixtures from module attributes by attribute name (see test_aio.py).
agent_factory = agent_fixtures.agent_factory


@pytest.mark.parametrize(
    ("topic", "key", "error"),
    [
        (None, None, InvalidTopicError),
        ("caf\udc80", None, InvalidTopicError),
        ("x" * 70_000, None, InvalidTopicError),
        ("fine", 7, InvalidEventError),
        ("fine", "\udc80", InvalidEventError),
    ],
    ids=["None topic", "surrogate topic", "70k topic", "int key", "surrogate key"],
)
def test_arguments_the_wire_cannot_carry_raise_like_spool_send(
    tmp_path: Path, topic: Any, key: Any, error: type[Exception]
) -> None:
    with Client(tmp_path / "nobody.sock", timeout=0.2) as client, pytest.raises(error):
        client.send(topic, b"x", key)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"topic": "t", "exchange": "x"}, "give one of them"),
        ({"exchange": 5}, "exchange must be a str"),
        ({"routing_key": b"k"}, "routing_key must be a str"),
        ({"routing_key": "k" * 256}, "routing_key of 256 bytes"),
        ({"routing_key": "\udc80"}, "routing_key is not encodable"),
        ({"key": 7}, "key for exchange 'x' must be bytes"),
    ],
)
def test_publish_arguments_are_checked_before_any_connection(
    tmp_path: Path, arguments: dict[str, Any], message: str
) -> None:
    call: dict[str, Any] = {"topic": None, "value": b"x", "exchange": "x", **arguments}
    with (
        Client(tmp_path / "nobody.sock", timeout=0.2) as client,
        pytest.raises(InvalidEventError, match=message),
    ):
        client.send(**call)


@pytest.mark.parametrize("event_id", ["order-17", b"0" * 36, uuid.UUID(int=0), 17])
def test_a_bad_event_id_raises_before_any_connection(tmp_path: Path, event_id: Any) -> None:
    with Client(tmp_path / "nobody.sock", timeout=0.2) as client:
        with pytest.raises(InvalidEventError, match="event_id"):
            client.send("t", b"x", event_id=event_id)
        with pytest.raises(InvalidEventError, match="event_id"):
            client.send_async(None, b"x", exchange="x", event_id=event_id)
        with pytest.raises(InvalidEventError, match="event_id"):
            client.send_many("t", [(b"x", None, None, event_id)])


@pytest.mark.parametrize("method", ["send", "send_async"])
def test_a_client_never_initialised_raises_instead_of_crashing(method: str) -> None:
    """`send()` and `send_async()` are compiled down to the pipeline's C methods: on a
    client whose __init__ never ran (a subclass that forgot it) they must raise, not read
    through None."""
    client = Client.__new__(Client)
    with pytest.raises(TypeError, match="not initialised"):
        getattr(client, method)("orders", b"x")


def test_a_bad_argument_in_one_thread_never_strands_the_others(tmp_path: Path) -> None:
    """With no agent, every thread's send ends (with an error), none spins forever."""
    client = Client(tmp_path / "nobody.sock", timeout=0.3)
    outcomes: list[str] = []

    def good() -> None:
        try:
            client.send("fine", b"x")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=good) for _ in range(8)]
    for thread in threads:
        thread.start()
    with pytest.raises(InvalidEventError):
        client.send("fine", b"x", 7)  # type: ignore[arg-type]
    for thread in threads:
        thread.join(10)
    assert not any(thread.is_alive() for thread in threads)
    assert outcomes == ["AgentError"] * 8


# ---- against a running agent -------------------------------------------------------------


def test_send_many_answers_each_event_in_order(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    topic = topic_factory(2)
    agent = agent_factory()
    agent.start()
    events: list[BatchEvent] = [b"plain", (b"keyed", "user-1"), (b"x" * 200_000, None)]
    events += [(b"with a header", b"k", [("trace", b"t-1")]), None]
    chosen = str(uuid.uuid4())
    events.append((b"with its own id", None, None, chosen))
    with Client(agent.socket_path) as client:
        outcomes = client.send_many(topic, events)
        assert client.send_many(topic, []) == []
        with pytest.raises(InvalidEventError, match="tuple of 5"):
            client.send_many(topic, [(b"v", None, None, None, None)])  # type: ignore[list-item]
    assert isinstance(outcomes[2], EventTooLargeError)
    assert outcomes[-1] == chosen
    ids = [outcome for outcome in outcomes if isinstance(outcome, str)]
    assert len(ids) == 5
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60)
    assert ledger(ids, seen).lost == 0


def test_send_async_futures_resolve_without_waiting_callers(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Many futures from many threads, nobody waiting on them until the end: the
    client's reader thread must settle them all."""
    topic = topic_factory(3)
    agent = agent_factory()
    agent.start()
    futures: list[Future[str]] = []
    with Client(agent.socket_path) as client:

        def fire(thread: int) -> None:
            futures.extend(
                client.send_async(topic, b"thread %d event %d" % (thread, n)) for n in range(500)
            )

        threads = [threading.Thread(target=fire, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        not_done = wait(futures, timeout=30).not_done
        too_large = client.send_async(topic, b"x" * 200_000)
        assert isinstance(too_large.exception(10), EventTooLargeError)
    assert not not_done
    ids = [future.result() for future in futures]
    assert len(set(ids)) == 4000
    # A future its caller keeps does not keep the event's bytes once they are written.
    assert all(vars(future)["_payload"] == b"" for future in futures)
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60)
    assert ledger(ids, seen).lost == 0


def test_one_caller_firing_send_async_shares_frames(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Events fired while one for their topic is in flight go out together after its
    answer: far fewer requests than events, where writing each at once makes one each."""
    topic = topic_factory(2)
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as client:
        client.send(topic, b"connect")
        before = client.stats()["requests"]
        futures = [client.send_async(topic, b"event %d" % n) for n in range(5000)]
        assert not wait(futures, timeout=60).not_done
        requests = client.stats()["requests"] - before - 1  # the STATS is no request
    ids = [future.result() for future in futures]
    assert len(set(ids)) == 5000
    assert requests <= 2500, f"{requests} requests for 5,000 events"
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60)
    assert ledger(ids, seen).lost == 0


def test_send_async_waits_while_max_queued_events_await_their_answer(
    agent_factory: AgentFactory, topic_factory: Callable[[int], str]
) -> None:
    """With the agent stopped (SIGSTOP), calls within the bound return at once and the
    next waits for its own answer, which comes once the agent runs again (SIGCONT)."""
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path, max_queued=50) as client:
        client.send(topic, b"connect")
        agent.freeze()
        resume = threading.Timer(1.0, agent.thaw)
        try:
            started = time.monotonic()
            futures = [client.send_async(topic, b"event %d" % n) for n in range(50)]
            within_bound = time.monotonic() - started
            resume.start()
            over = client.send_async(topic, b"over the bound")
            waited = time.monotonic() - started
        finally:
            resume.join()
            agent.thaw()
        assert over.done(), "the call over the bound returns once its event is answered"
        assert within_bound < 0.9
        assert waited >= 0.9
        ids = [future.result(30) for future in [*futures, over]]
    assert len(set(ids)) == 51


def test_send_async_to_a_dead_agent_fails_its_future(tmp_path: Path) -> None:
    with Client(tmp_path / "nobody.sock", timeout=0.3) as client:
        future = client.send_async("fine", b"x")
        assert isinstance(future.exception(5), AgentError)


@pytest.mark.timeout(30)  # a timeval of zero would hang it
@pytest.mark.parametrize("timeout", [0.3, 1e-7])
def test_an_agent_that_never_answers_fails_the_call_within_its_timeout(
    tmp_path: Path, timeout: float
) -> None:
    """The socket gives up after `timeout` (SO_RCVTIMEO), however short: a timeval of
    zero would mean never."""
    path = tmp_path / "silent.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen()
        started = time.monotonic()
        with Client(path, timeout=timeout) as client, pytest.raises(AgentError):
            client.ping()
        assert time.monotonic() - started < 5


def test_a_tcp_agent_that_never_answers_its_greeting_times_out_in_words(
    tmp_path: Path,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with (
            Client(f"tcp://127.0.0.1:{port}", timeout=0.3) as client,
            pytest.raises(AgentError, match=r"no answer within 0\.3 s"),
        ):
            client.ping()


class _HeaderName(enum.StrEnum):
    TRACE = "trace"


def test_headers_named_by_a_str_enum_are_sent(agent_factory: AgentFactory) -> None:
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path) as client:
        assert client.send("enum-headers", b"v", headers={_HeaderName.TRACE: b"x"})


def test_one_client_shared_by_sixteen_threads_pipelines_their_sends(
    agent_factory: AgentFactory, broker: LocalBroker, topic_factory: Callable[[int], str]
) -> None:
    """Each thread's send returns its own id; a caller alone with its answer reads it."""
    topic = topic_factory(4)
    agent = agent_factory()
    agent.start()
    ids: list[str] = []
    with Client(agent.socket_path) as client:

        def send(thread: int) -> None:
            for n in range(200):
                ids.append(client.send(topic, b"thread %d event %d" % (thread, n)))

        threads = [threading.Thread(target=send, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert client.stats()["connections"] == 1
        assert client.ping() < 5
    assert len(set(ids)) == 3200
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60)
    assert ledger(ids, seen).lost == 0


def test_a_done_callback_that_sends_over_the_bounds_does_not_wait_for_itself(
    agent_factory: AgentFactory, topic_factory: Callable[[int], str]
) -> None:
    """Callbacks run on the thread reading answers. One that sends again, over
    `max_queued` and with a full batch queued, must neither wait for its own answer
    (nobody else would read it: it would wait out the timeout) nor for room to write."""
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start()
    sent: list[Future[str]] = []
    done = threading.Event()

    def send_three(_future: Future[str]) -> None:
        sent.extend(client.send_async(topic, b"from a callback %d" % n) for n in range(3))
        done.set()

    with Client(agent.socket_path, timeout=5.0, max_queued=1, max_batch=1) as client:
        client.send(topic, b"connect")
        started = time.monotonic()
        first = client.send_async(topic, b"first")
        first.add_done_callback(send_three)
        assert done.wait(15)
        elapsed = time.monotonic() - started
        ids = [future.result(5) for future in [first, *sent]]
    assert elapsed < 4.0, f"a callback waited on itself: {elapsed:.1f} s"
    assert len(set(ids)) == 4


def test_close_while_a_writer_connects_leaves_no_connection_behind(
    agent_factory: AgentFactory, topic_factory: Callable[[int], str]
) -> None:
    """A writer that checked the client open, then connects while close() runs: the new
    connection is not kept (no frame after close(), no reader left running)."""
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start()
    client = Client(agent.socket_path, timeout=5.0)
    pipeline = client._pipeline
    connect = pipeline._open_connection

    def close_meanwhile() -> Connection:
        connection = connect()
        client.close()
        return connection

    pipeline._open_connection = close_meanwhile  # type: ignore[method-assign]
    readers_before = {t for t in threading.enumerate() if t.name == "eventspool-client-reader"}
    with pytest.raises(AgentError, match="the client was closed"):
        client.send(topic, b"written after close")
    assert pipeline._connection is None
    readers = {t for t in threading.enumerate() if t.name == "eventspool-client-reader"}
    assert readers <= readers_before


def test_no_agent_at_a_relative_socket_path_says_where_it_looked_and_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with (
        Client(Path("spool") / "agent.sock", timeout=0.2) as client,
        pytest.raises(AgentError, match="cannot connect to the agent") as raised,
    ):
        client.send("orders", b"x")
    message = str(raised.value)
    assert str(tmp_path / "spool" / "agent.sock") in message
    assert "relative to the current folder" in message
    assert "eventspool agent --config" in message
    assert "EVENTSPOOL_AGENT_SOCKET" in message


def _readers() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "eventspool-client-reader"}


def test_a_caller_alone_reads_its_own_answers_without_a_reader_thread(
    agent_factory: AgentFactory, topic_factory: Callable[[int], str]
) -> None:
    """Short-lived blocking callers start no thread: starting and joining one was most
    of their time. The first send_async() starts it, to settle its future."""
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start()
    before = _readers()
    with Client(agent.socket_path) as client:
        chosen = [str(uuid.uuid4()) for _ in range(50)]
        assert [client.send(topic, b"alone", event_id=event_id) for event_id in chosen] == chosen
        assert client.send_many(topic, [b"a", b"b"])
        assert _readers() == before
        assert client.send_async(topic, b"fired").result(10)
        assert len(_readers() - before) == 1
    assert _readers() <= before


def test_sixteen_threads_mixing_calls_each_get_their_own_answers(
    agent_factory: AgentFactory, topic_factory: Callable[[int], str]
) -> None:
    """Callers that find the client alone and callers that arrive while one of them has
    its SEND in flight: every answer goes to its own request (each event's chosen id
    comes back to the call that sent it)."""
    topics = [topic_factory(1) for _ in range(3)]
    agent = agent_factory()
    agent.start()
    errors: list[BaseException] = []
    with Client(agent.socket_path) as client:

        def mix(thread: int) -> None:
            try:
                for n in range(60):
                    topic = topics[(thread + n) % len(topics)]
                    chosen = [str(uuid.uuid4()) for _ in range(3)]
                    if n % 3 == 0:
                        assert client.send(topic, b"one", event_id=chosen[0]) == chosen[0]
                    elif n % 3 == 1:
                        batch: list[BatchEvent] = [(b"many", None, None, c) for c in chosen]
                        assert client.send_many(topic, batch) == chosen
                    else:
                        future = client.send_async(topic, b"async", event_id=chosen[0])
                        assert client.send(topic, b"after", event_id=chosen[1]) == chosen[1]
                        assert future.result(10) == chosen[0]
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        threads = [threading.Thread(target=mix, args=(n,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert client.stats()["connections"] == 1
    assert not errors, errors[0]


def test_a_lone_call_cut_off_by_an_agent_restart_fails_then_the_next_reconnects(
    agent_factory: AgentFactory, topic_factory: Callable[[int], str]
) -> None:
    """The agent dies while a lone caller waits for its answer: the call fails with
    AgentError (its outcome unknown), and the next call reconnects to the new agent."""
    topic = topic_factory(1)
    agent = agent_factory()
    agent.start()
    with Client(agent.socket_path, timeout=10.0) as client:
        client.send(topic, b"connect")
        agent.freeze()  # the next SEND is written, never answered
        outcome: list[str | BaseException] = []

        def send() -> None:
            try:
                outcome.append(client.send(topic, b"cut off"))
            except AgentError as exc:
                outcome.append(exc)

        caller = threading.Thread(target=send)
        caller.start()
        time.sleep(0.3)
        assert client._pipeline._connection is not None
        assert client._pipeline._connection.alone  # written, and waiting in person
        agent.kill()
        caller.join(10)
        assert not caller.is_alive()
        assert isinstance(outcome[0], AgentError)
        assert "outcome is unknown" in str(outcome[0])
        agent.start_answering()
        chosen = str(uuid.uuid4())
        assert client.send(topic, b"after the restart", event_id=chosen) == chosen
