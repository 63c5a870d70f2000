"""Readiness for systemd's `Type=notify`: tell the service manager when the agent is ready.

systemd passes the path of a datagram socket in `$NOTIFY_SOCKET` (a leading `@` names an
abstract socket). The agent sends `READY=1` once its socket accepts connections, so
units ordered after it start only then, and `STOPPING=1` when it begins to stop. Without
the variable (not under systemd) nothing is sent. Written here rather than depending on
a library: the protocol is one datagram.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

NOTIFY_SOCKET = "NOTIFY_SOCKET"


def notify(*assignments: str) -> bool:
    """Send `KEY=value` lines to the service manager; False when there is none to tell.

    A failure is logged, never raised: the agent must not stop serving because the
    service manager could not be told.
    """
    address = os.environ.get(NOTIFY_SOCKET)
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    message = "\n".join(assignments).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError as exc:
        log.warning("cannot notify the service manager at %s: %s", address, exc)
        return False
    return True
