"""TLS for the agent's TCP listener, with the standard `ssl` module.

The server certificate and key come from `[tls]` in agent.toml; with `client_ca_file`,
every client must present a certificate that CA signed (mutual TLS), and its subject's
common name is what `[[access]]` rules match as `cert_cns`. TLS 1.2 is the oldest
version accepted.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eventspool.wire.tls import openssl_text


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """`[tls]`: the listener's certificate chain and key, and the CA of client certificates."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None


class TlsFileError(ValueError):
    """A file of `[tls]` cannot be used; `key` is the setting at fault."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def server_context(settings: TlsSettings) -> ssl.SSLContext:
    """The listener's context; raises TlsFileError naming the file that cannot be used.

    Each file is tried on its own first, so the error names the right one: a certificate
    file that holds no certificate, a key that is not the certificate's, a CA file that
    holds no CA.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    _load("tls.cert_file", settings.cert_file, probe.load_verify_locations)

    def no_passphrase() -> bytes:  # asked only for an encrypted key; never prompt
        raise TlsFileError(
            "tls.key_file", f"{settings.key_file}: the key is encrypted; give an unencrypted one"
        )

    try:
        context.load_cert_chain(settings.cert_file, settings.key_file, password=no_passphrase)
    except OSError as exc:
        if not settings.key_file.is_file():
            raise TlsFileError("tls.key_file", _reason(settings.key_file, exc)) from exc
        raise TlsFileError(
            "tls.key_file",
            f"{settings.key_file}: not a PEM private key matching tls.cert_file "
            f"({openssl_text(exc)})",
        ) from exc
    if settings.client_ca_file is not None:
        _load("tls.client_ca_file", settings.client_ca_file, context.load_verify_locations)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def _load(key: str, path: Path, load: Any) -> None:
    try:
        load(path)
    except OSError as exc:  # ssl.SSLError is one
        raise TlsFileError(key, _reason(path, exc)) from exc


def _reason(path: Path, exc: OSError) -> str:
    if isinstance(exc, ssl.SSLError):
        return f"{path}: not a PEM certificate file ({openssl_text(exc)})"
    return f"{path}: {exc.strerror or exc}"


def common_name(peercert: dict[str, Any] | None) -> str | None:
    """The subject's common name of a verified peer certificate (`getpeercert()`); None
    without one, or when it has several."""
    if not peercert:
        return None
    names = [
        value
        for rdn in peercert.get("subject", ())
        for attribute, value in rdn
        if attribute == "commonName"
    ]
    return names[0] if len(names) == 1 else None
