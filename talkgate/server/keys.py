"""API keys as identities: who a request is (key id, tenant, role), from `talkgate serve --keys FILE` or the
single-tenant shortcut `--api-key` (docs/operations.md, "Keys file").

The keys file is JSON lines, one key a line; blank lines and lines starting with # are skipped:

    {"id": "acme-prod", "tenant": "acme", "role": "user", "sha256": "<64 hex digits>", "limits": {"connections": 50}}

`sha256` is the hex SHA-256 of the secret the client sends (`printf %s "$SECRET" | sha256sum`): the file never
holds a secret. A request's key is hashed and compared with every stored hash in constant time (no early exit,
so the time says nothing about which key, or how much of one, matched).

Every worker process reloads the file on SIGHUP and when it changes (KeysFile.poll). A file that does not parse
at start fails start-up with its line and why; on reload it is logged and the keys in force stay.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("talkgate.keys")
DEFAULT_TENANT = "default"      # the tenant of --api-key keys, of a server without keys, and of voices stored before tenants
ROLES = ("admin", "user")
# per key, enforced by server/key_limits.py (`voices`: the voices its tenant may hold in the store, when this key
# stores one: server/voices_http.py); absent: only the server's own limits
LIMITS = ("connections", "contexts", "requests_per_minute", "characters_per_minute", "audio_seconds_per_day",
          "voices")
MAX_FILE_BYTES = 4 << 20
MAX_KEYS = 10_000
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}\Z")       # a key id or a tenant: safe in logs and records
HEX_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
FIELDS = ("id", "tenant", "role", "sha256", "limits")


class KeysError(Exception):
    """A keys file that cannot be used: `line` (1-based, None for the file as a whole) and why."""

    def __init__(self, source: str, line: int | None, why: str):
        super().__init__(f"keys file {source}{f' line {line}' if line else ''}: {why}")
        self.source, self.line, self.why = source, line, why


@dataclass(frozen=True)
class Identity:
    """Who a request is: its key's id (None on a server without keys), tenant and role."""
    key_id: str | None
    tenant: str
    role: str = "user"
    limits: dict = field(default_factory=dict, compare=False)

    @property
    def admin(self) -> bool:
        return self.role == "admin"


OPEN = Identity(None, DEFAULT_TENANT, "admin")      # every client of a server without keys (as before tenants)


@dataclass(frozen=True)
class Key:
    identity: Identity
    digest: bytes           # SHA-256 of the secret


def digest(secret: str) -> bytes:
    """Any string may come (compare_digest refuses non-ASCII str; surrogates are kept, never an error)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()


class Keyring:
    """The keys in force."""

    def __init__(self, keys: tuple[Key, ...]):
        self.keys = keys

    @classmethod
    def from_secrets(cls, secrets: tuple[str, ...]) -> "Keyring":
        """--api-key / TALKGATE_API_KEYS: each an admin of the default tenant, with ids api-key-1, -2, ..."""
        return cls(tuple(Key(Identity(f"api-key-{n}", DEFAULT_TENANT, "admin"), digest(s))
                         for n, s in enumerate(secrets, 1)))

    def identify(self, secret: str | None) -> Identity | None:
        if secret is None:
            return None
        given, found = digest(secret), None
        for key in self.keys:           # every key, whichever matches: constant time
            if hmac.compare_digest(given, key.digest):
                found = key.identity
        return found


def parse(text: str, source: str) -> Keyring:
    """The keys file's text -> its keys; KeysError naming the first bad line and why."""
    keys, ids, digests = [], set(), set()
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(keys) == MAX_KEYS:
            raise KeysError(source, n, f"more than {MAX_KEYS} keys")
        try:
            entry = json.loads(line)
        except ValueError as e:
            raise KeysError(source, n, f"not JSON ({e})") from None
        if not isinstance(entry, dict):
            raise KeysError(source, n, "a key is a JSON object")
        key = _key(entry, lambda why: KeysError(source, n, why))
        if key.identity.key_id in ids:
            raise KeysError(source, n, f"the id {key.identity.key_id!r} is used twice")
        if key.digest in digests:
            raise KeysError(source, n, "the same sha256 is given twice")
        ids.add(key.identity.key_id)
        digests.add(key.digest)
        keys.append(key)
    return Keyring(tuple(keys))


def _key(entry: dict, error) -> Key:
    unknown = sorted(set(entry) - set(FIELDS))
    if unknown:
        raise error(f"unknown field {unknown[0]!r}; a key has {', '.join(FIELDS)}")
    for name in ("id", "tenant"):
        if not isinstance(entry.get(name), str) or not NAME.match(entry[name]):
            raise error(f"{name} must be 1-64 letters, digits and . _ @ - (starting with a letter or digit)")
    role = entry.get("role", "user")
    if role not in ROLES:
        raise error(f"role must be admin or user, not {role!r}")
    if "secret" in entry or not isinstance(entry.get("sha256"), str) or not HEX_SHA256.match(entry["sha256"]):
        raise error("sha256 must be the secret's SHA-256 in 64 lower-case hex digits (printf %s \"$SECRET\" | sha256sum)")
    limits = entry.get("limits", {})
    if not isinstance(limits, dict):
        raise error("limits must be an object")
    for name, value in limits.items():
        if name not in LIMITS:
            raise error(f"unknown limit {name!r}; limits are {', '.join(LIMITS)}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise error(f"the limit {name} must be a positive integer")
    return Key(Identity(entry["id"], entry["tenant"], role, dict(limits)), bytes.fromhex(entry["sha256"]))


class KeysFile:
    """A keys file and the keys it held when last read well."""

    def __init__(self, path: str | Path):
        """Reads the file now: KeysError when it cannot be used (start-up fails with it)."""
        self.path = Path(path)
        self.signature: tuple | None = None
        self.keyring = self._read()

    def _stat(self) -> tuple:
        st = os.stat(self.path)
        return st.st_ino, st.st_size, st.st_mtime_ns

    def _read(self) -> Keyring:
        try:
            signature = self._stat()
            if signature[1] > MAX_FILE_BYTES:
                raise KeysError(str(self.path), None, f"over {MAX_FILE_BYTES >> 20} MiB")
            text = self.path.read_bytes().decode("utf-8")
        except OSError as e:
            raise KeysError(str(self.path), None, e.strerror or str(e)) from None
        except UnicodeDecodeError:
            raise KeysError(str(self.path), None, "not UTF-8 text") from None
        keyring = parse(text, str(self.path))
        self.signature = signature
        return keyring

    def changed(self) -> bool:
        """Whether the file differs from the one last read (a stat: cheap enough to poll)."""
        try:
            return self._stat() != self.signature
        except OSError:
            return self.signature is not None

    def reload(self) -> KeysError | None:
        """Read the file again; a bad one is logged (its line and why) and the keys in force stay -> its error."""
        try:
            self.keyring = self._read()
        except KeysError as e:
            try:
                self.signature = self._stat()       # logged once, not at every poll, until it changes again
            except OSError:
                self.signature = None
            log.error("%s; the %d key(s) in force stay", e, len(self.keyring.keys))
            return e
        log.info("keys file %s reloaded: %d key(s)", self.path, len(self.keyring.keys))
        return None
