"""The topic-exchange tutorial's cases, shared by the tests that run them on the broker.

Q1 is bound with `*.orange.*`, Q2 with `*.*.rabbit` and `lazy.#`. Each routing key maps
to the queues it reaches; "unroutable" is the alternate topic, which receives what
matches no binding (RabbitMQ's alternate exchange).
"""

from __future__ import annotations

TUTORIAL = {
    "quick.orange.rabbit": {"Q1", "Q2"},
    "lazy.orange.elephant": {"Q1", "Q2"},
    "quick.orange.fox": {"Q1"},
    "lazy.brown.fox": {"Q2"},
    "lazy.pink.rabbit": {"Q2"},
    "quick.brown.fox": {"unroutable"},
    "orange": {"unroutable"},
    "quick.orange.new.rabbit": {"unroutable"},
    "lazy.orange.new.rabbit": {"Q2"},
}
