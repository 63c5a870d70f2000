"""``eventspool broker --brokers N``: a mock cluster in the foreground, steered by typed lines.

For trying a failover by hand: point a spool, an agent or a consumer at the printed
bootstrap list, then move leaders, take a broker down or inject errors, and watch what
they do. The cluster lives as long as the console; it keeps everything in memory.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from typing import TextIO

from confluent_kafka import KafkaError

from eventspool.broker.local import BrokerError
from eventspool.broker.mock import ApiKey, MockCluster

HELP = """commands (one per line; Ctrl-D or 'quit' ends the cluster):
  topic NAME PARTITIONS [REPLICATION]   create a topic (default replication: all brokers)
  leader TOPIC PARTITION BROKER|none    move a partition's leadership, or leave it leaderless
  down BROKER / up BROKER               take a broker down (its leaders stay) / bring it back
  rtt BROKER MS                         delay every answer of a broker (-1: all brokers)
  coordinator GROUP BROKER              move a consumer group's coordinator
  errors REQUEST CODE [CODE ...]        answer the next requests of a type with these errors,
                                        e.g. 'errors produce NOT_LEADER_FOR_PARTITION 45'
  add BROKER                            add a broker with this id
  help"""


def _code(text: str) -> int:
    """A Kafka error code by number or by confluent-kafka's name (NOT_COORDINATOR)."""
    if text.lstrip("-").isdigit():
        return int(text)
    code = getattr(KafkaError, text.upper(), None)
    if not isinstance(code, int):
        raise ValueError(
            f"unknown error code {text!r}: give a number or a name such as NOT_COORDINATOR"
        )
    return code


def _api_key(text: str) -> ApiKey:
    try:
        return ApiKey(int(text)) if text.isdigit() else ApiKey[text.upper()]
    except (KeyError, ValueError):
        names = ", ".join(key.name.lower() for key in ApiKey)
        raise ValueError(f"unknown request type {text!r}: one of {names}") from None


def _broker(text: str) -> int | None:
    return None if text.lower() in ("none", "-1") else int(text)


def execute(cluster: MockCluster, line: str) -> str | None:
    """Carry out one console line; returns what to print (None: nothing)."""
    words = shlex.split(line)
    if not words:
        return None
    command, args = words[0].lower(), words[1:]
    actions: dict[str, Callable[[], None]] = {
        "topic": lambda: cluster.create_topic(
            args[0], int(args[1]), int(args[2]) if len(args) > 2 else cluster.brokers
        ),
        "leader": lambda: cluster.set_leader(args[0], int(args[1]), _broker(args[2])),
        "down": lambda: cluster.broker_down(int(args[0])),
        "up": lambda: cluster.broker_up(int(args[0])),
        "rtt": lambda: cluster.set_rtt(int(args[0]), int(args[1])),
        "coordinator": lambda: cluster.set_coordinator(args[0], int(args[1])),
        "errors": lambda: cluster.push_request_errors(
            _api_key(args[0]), [_code(code) for code in args[1:]]
        ),
        "add": lambda: cluster.add_broker(int(args[0])),
    }
    if command == "help":
        return HELP
    action = actions.get(command)
    if action is None:
        return f"unknown command {command!r}; 'help' lists them"
    try:
        action()
    except IndexError:
        return f"{command}: missing arguments; 'help' shows them"
    except (ValueError, BrokerError) as exc:
        return f"{command}: {exc}"
    return "ok"


def run_console(brokers: int, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> None:
    with MockCluster(brokers) as cluster:
        print(cluster.bootstrap_servers, file=stdout, flush=True)
        print(
            f"a {brokers}-broker mock cluster (in memory) is up; 'help' lists the commands",
            file=sys.stderr,
        )
        for line in stdin:
            if line.strip().lower() in ("quit", "exit"):
                break
            answer = execute(cluster, line)
            if answer is not None:
                print(answer, file=stdout, flush=True)
