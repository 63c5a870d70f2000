"""Clients of the local agent, with the same `send()` as the in-process Spool."""
