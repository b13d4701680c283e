"""A self-signed certificate for 127.0.0.1, made with openssl, for the tests that serve TLS."""
from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(directory: Path) -> tuple[Path, Path]:
    """(cert.pem, key.pem) in `directory`: RSA-2048, valid two days, subjectAltName IP:127.0.0.1."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key
