"""Ships spooled events to Kafka and moves each queue's read position only on broker ack."""
