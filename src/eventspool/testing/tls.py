"""Certificates made at run time with the `openssl` command: a CA, a server certificate
for 127.0.0.1 and localhost, and client certificates by common name.

Keys are P-256 (fast to make), certificates last two days, and the extensions are those
strict verifiers ask for (key identifiers, key usage), so the same files work under
every Python's default verification.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

__all__ = ["Pki", "have_openssl"]

_CONFIG = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
[client]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""
_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def have_openssl() -> bool:
    return shutil.which("openssl") is not None


class Pki:
    """A CA in `directory` (made by the constructor) that signs the certificates asked of it."""

    def __init__(self, directory: Path, name: str = "eventspool-test-ca") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self._config = directory / "openssl.cnf"
        self._config.write_text(_CONFIG)
        self._serial = 1
        self.ca_cert = directory / f"{name}.pem"
        self.ca_key = directory / f"{name}.key"
        ca = ["-x509", *_KEY, "-extensions", "ca", "-days", "2", "-subj", f"/CN={name}"]
        self._openssl("req", *ca, "-keyout", str(self.ca_key), "-out", str(self.ca_cert))

    def issue(self, common_name: str, *, server: bool = False) -> tuple[Path, Path]:
        """(certificate, key) files for `common_name`, signed by this CA."""
        self._serial += 1
        base = f"{common_name}-{self._serial}"
        cert, key, request = (self.directory / f"{base}.{kind}" for kind in ("pem", "key", "csr"))
        subject = ["-subj", f"/CN={common_name}"]
        self._openssl("req", "-new", *_KEY, *subject, "-keyout", str(key), "-out", str(request))
        signer = ["-CA", str(self.ca_cert), "-CAkey", str(self.ca_key)]
        extensions = [
            "-extfile",
            str(self._config),
            "-extensions",
            "server" if server else "client",
        ]
        serial = ["-set_serial", str(self._serial), "-days", "2"]
        self._openssl(
            "x509", "-req", "-in", str(request), *signer, *serial, *extensions, "-out", str(cert)
        )
        request.unlink()
        return cert, key

    def client_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """A client's context that trusts this CA, presenting `cert` when given."""
        context = ssl.create_default_context(cafile=self.ca_cert)
        if cert is not None:
            context.load_cert_chain(*cert)
        return context

    def _openssl(self, *arguments: str) -> None:
        config = ["-config", str(self._config)] if arguments[0] == "req" else []
        subprocess.run(
            ["openssl", arguments[0], *config, *arguments[1:]],
            check=True,
            capture_output=True,
        )
