"""The durable spool: one memory-mapped ring file per (topic, partition)."""
