"""Tools for proving eventspool under faults, used by the tests, the soak and the benchmarks.

Real parts only: a TCP proxy that cuts connections, a broker behind it, the agent as a
process of its own, and append-only ledger files of event ids that survive a SIGKILL.
"""
