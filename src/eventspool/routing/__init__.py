"""Exchanges in front of Kafka topics: direct, fanout and topic routing, RabbitMQ style."""

from eventspool.routing.exchanges import (
    Binding,
    Exchange,
    ExchangeType,
    Route,
    validate_exchange_name,
    validate_routing_key,
)
from eventspool.routing.table import ExchangeCounts, ExchangeInfo, Source

__all__ = [
    "Binding",
    "Exchange",
    "ExchangeCounts",
    "ExchangeInfo",
    "ExchangeType",
    "Route",
    "Source",
    "validate_exchange_name",
    "validate_routing_key",
]
