"""What the agent counts about its clients, for STATS and `/metrics`.

One object shared by the server, its connections and the send path, so each counter
has one home however many places add to it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AgentCounters:
    protocol_errors: int = 0
    requests: int = 0  # SEND and PUBLISH frames: events / requests is the batching
    tls_handshake_failures: int = 0
    auth_failures: int = 0  # TCP connections refused for a missing or unknown token
