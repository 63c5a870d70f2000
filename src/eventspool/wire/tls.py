"""TLS failures in words, the same in the agent's errors and the clients'."""

from __future__ import annotations

import re


def openssl_text(exc: OSError) -> str:
    """OpenSSL's words without CPython's source location."""
    return re.sub(r" \(_ssl\.c:\d+\)$", "", exc.strerror or str(exc))
