"""A consumer that runs long handlers in worker processes without leaving its group."""

from eventspool.consumer.handler import HandlerError
from eventspool.consumer.record import Record
from eventspool.consumer.runner import Consumer, ConsumerError
from eventspool.consumer.scheduler import Ordering
from eventspool.consumer.settings import ConsumerSettings
from eventspool.consumer.status import ConsumerStatus

__all__ = [
    "Consumer",
    "ConsumerError",
    "ConsumerSettings",
    "ConsumerStatus",
    "HandlerError",
    "Ordering",
    "Record",
]
