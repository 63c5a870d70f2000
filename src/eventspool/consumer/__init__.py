"""A consumer that runs long handlers in worker processes without leaving its group."""

from eventspool.consumer.pool import HandlerError
from eventspool.consumer.record import Record
from eventspool.consumer.runner import Consumer, ConsumerError, ConsumerStatus
from eventspool.consumer.scheduler import Ordering
from eventspool.consumer.settings import ConsumerSettings

__all__ = [
    "Consumer",
    "ConsumerError",
    "ConsumerSettings",
    "ConsumerStatus",
    "HandlerError",
    "Ordering",
    "Record",
]
