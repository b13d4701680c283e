"""The voice store: cloned voices kept on disk, one directory shared by every process (and server) pointed at it.

    store = VoiceStore(Path("/var/lib/talkgate/voices"))
    with store.claim("Brand voice") as claim:       # the name, atomically, before the voice is computed
        voice = claim.save(prompt, source={...})     # durable and visible to every process at once
    store.get(voice.id, who) or store.get("brand voice", who)  # by id, or by name (case-insensitive), as `who` sees it
    store.delete(voice.id)

Layout (`talkgate serve --voice-store DIR`; default: default_root()):

    voices/<id>.json   one voice: its synth.api.VoicePrompt (x-vector, reference codes and text) and what it was
                       made from. Written whole to tmp/, fsynced, then renamed into place: a reader sees all of
                       it or nothing, and a crash leaves nothing half-stored.
    names/<digest>     the claim on a name: a symlink to ../voices/<id>.json (digest: sha256 of the name,
                       NFKC-casefolded, after the tenant's name and a newline unless the tenant is the default one:
                       names are per tenant, and a store made before tenants keeps its names). Symlink creation is atomic and fails when the name is taken, on a local
                       or an NFS directory alike, so of two uploads of one name, from anywhere, exactly one
                       goes on; the claim is made before the voice is computed, so the loser is told at once.
    tmp/               files being written.

Tenants: a voice belongs to the tenant of the key that stored it (`tenant`, `key_id`; a voice stored before
tenants belongs to the default tenant). A client sees and speaks its tenant's voices and those an admin shared
(`shared`); an admin sees every voice. Any other voice is, to it, a voice that does not exist.

A voice exists exactly when voices/<id>.json does. A claim whose voice does not exist is an upload in flight
(bounded by its engine timeout), or what a crash (or a delete cut short) left: once older than STALE_S it
is taken over. Lookups stat the file (a new voice is seen by every process at once, a deleted one is gone at
once) and reuse the parsed voice while its file is unchanged. Reads and the claim are a few system calls
and are made on the event loop; the fsyncs of save and delete run on a worker thread (voices_http.py).
"""
from __future__ import annotations

import base64
import errno
import hashlib
import json
import logging
import os
import secrets
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

from talkgate.server.keys import DEFAULT_TENANT, Identity
from talkgate.sessions.voices import STORED_ID, VOICE_ID_PREFIX
from talkgate.synth.api import VoicePrompt

log = logging.getLogger("talkgate.voice_store")
FORMAT = "talkgate.voice/1"
MAX_VOICES = 1000            # voices in one store; more uploads are refused (voice_limit_reached)
MAX_NAME_CHARS = 100
STALE_S = 120.0              # a claim without its voice this old is a crash's leftover: taken over
TMP_STALE_S = 3600.0         # a file in tmp/ this old is a crash's leftover: removed when the store is opened
CACHE = 4096                 # parsed voices kept per process (each a few KiB)


def default_root() -> Path:
    """The store under the talkgate data directory: TALKGATE_DATA, else $XDG_DATA_HOME/talkgate, else
    ~/.local/share/talkgate; the store is its voices/ folder."""
    data = os.environ.get("TALKGATE_DATA") or Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "talkgate"
    return Path(data) / "voices"


class StoreError(Exception):
    """A refusal a client is told about: `code`, `message`, and the HTTP `status` that answers it."""

    def __init__(self, code: str, message: str, status: int = 400, disk_fault: bool = False):
        super().__init__(message)
        self.code, self.message, self.status = code, message, status
        self.disk_fault = disk_fault       # the store's filesystem is read-only or full: a passing state, not a wrong path


# errors of a store whose directory is right but whose disk cannot take writes now (a read-only remount, a full disk)
DISK_FAULTS = {errno.EROFS, errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class StoredVoice:
    id: str
    name: str
    created_at: float                    # Unix time
    prompt: VoicePrompt
    description: str = ""
    language: str | None = None          # what the client said the voice speaks (Cartesia, ElevenLabs labels)
    consent: str | None = None           # the consent reference the client gave (stored, not verified)
    labels: dict = field(default_factory=dict)
    source: dict = field(default_factory=dict)     # the audio: format, seconds, rate, channels, file names
    model: dict = field(default_factory=dict)      # the model that made it (its x-vector fits this model size)
    api: str = "talkgate"                # the endpoint it was created through
    tenant: str = DEFAULT_TENANT         # its owner (server/keys.py), and the key that stored it
    key_id: str | None = None
    shared: bool = False                 # an admin made it usable by every tenant

    def visible_to(self, who: Identity) -> bool:
        return who.admin or self.shared or self.tenant == who.tenant

    def deletable_by(self, who: Identity) -> bool:
        return who.admin or self.tenant == who.tenant

    @property
    def mode(self) -> str:
        return "icl" if self.prompt.icl else "x-vector"

    def public(self) -> dict:
        """What a listing shows (no embedding, no codes)."""
        return {"id": self.id, "name": self.name, "created_at": int(self.created_at), "mode": self.mode,
                "ref_text": self.prompt.ref_text, "description": self.description, "language": self.language,
                "consent": self.consent, "labels": dict(self.labels), "audio": dict(self.source),
                "model": dict(self.model), "api": self.api, "tenant": self.tenant, "key_id": self.key_id,
                "shared": self.shared}

    def record(self) -> dict:
        p = self.prompt
        return {"format": FORMAT, **self.public(), "created_at": self.created_at,
                "embedding": base64.b64encode(p.embedding).decode(),
                "codes": base64.b64encode(p.codes).decode() if p.codes is not None else None}

    @classmethod
    def from_record(cls, d: dict) -> "StoredVoice":
        if d.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} record")
        codes = d.get("codes")
        prompt = VoicePrompt(base64.b64decode(d["embedding"]), base64.b64decode(codes) if codes else None,
                             d.get("ref_text"))
        return cls(d["id"], d["name"], float(d["created_at"]), prompt, d.get("description") or "", d.get("language"),
                   d.get("consent"), dict(d.get("labels") or {}), dict(d.get("audio") or {}),
                   dict(d.get("model") or {}), d.get("api") or "talkgate", d.get("tenant") or DEFAULT_TENANT,
                   d.get("key_id"), d.get("shared") is True)


def name_key(name: str) -> str:
    return unicodedata.normalize("NFKC", name).casefold()


def check_name(name: object) -> str:
    """A voice name as given, trimmed; StoreError(invalid_name) unless 1-MAX_NAME_CHARS printable characters."""
    if not isinstance(name, str) or not name.strip():
        raise StoreError("invalid_name", "a voice needs a name")
    name = name.strip()
    if len(name) > MAX_NAME_CHARS:
        raise StoreError("invalid_name", f"a voice name is at most {MAX_NAME_CHARS} characters")
    if any(unicodedata.category(ch) in ("Cc", "Cs", "Co") for ch in name):
        raise StoreError("invalid_name", "a voice name cannot hold control characters")
    return name


class Claim:
    """The right to store a voice under a name, until saved or released (a context manager releases it)."""

    def __init__(self, store: "VoiceStore", id: str, name: str, tenant: str, path: Path):
        self.store, self.id, self.name, self.tenant, self.path = store, id, name, tenant, path
        self.target = f"../voices/{id}.json"
        self.voice: StoredVoice | None = None

    def owned(self) -> bool:
        try:
            return os.readlink(self.path) == self.target
        except OSError:
            return False

    def save(self, prompt: VoicePrompt, **meta) -> StoredVoice:
        """Write the voice (durably) and publish it; StoreError if the claim was lost meanwhile."""
        if self.voice is not None:
            raise RuntimeError("this claim's voice is saved already")
        voice = StoredVoice(self.id, self.name, time.time(), prompt, tenant=self.tenant, **meta)
        self.store.write(voice, self)
        self.voice = voice
        return voice

    def release(self) -> None:
        """Give the name back unless the voice was saved. Where the store cannot be written (a read-only or full
        disk) the claim stays, and claim() takes it over once it is STALE_S old, as a crash's leftover: the error
        that ended the upload (voice_store_unavailable) is what its caller gets, not this one."""
        if self.voice is None and self.owned():
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("voice store: the claim on the name %r could not be given back (%s); it is taken over "
                            "once stale", self.name, e.strerror or e)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class VoiceStore:
    def __init__(self, root: str | Path, max_voices: int = MAX_VOICES):
        self.root = Path(root)
        self.max_voices = max_voices
        self.voices_dir, self.names_dir, self.tmp_dir = self.root / "voices", self.root / "names", self.root / "tmp"
        self._cache: OrderedDict[str, tuple[tuple, StoredVoice]] = OrderedDict()
        self._cache_lock = threading.Lock()         # deletes run on a worker thread
        self._opened = False

    def open(self) -> None:
        """Create the folders (mode 0700: voices are personal data) and remove what crashes left in tmp/;
        StoreError(voice_store_unavailable) when the directory cannot be written."""
        try:
            for d in (self.voices_dir, self.names_dir, self.tmp_dir):
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
            probe = self.tmp_dir / f"probe.{os.getpid()}.{secrets.token_hex(4)}"
            probe.write_bytes(b"")
            probe.unlink()
            now = time.time()
            for entry in os.scandir(self.tmp_dir):
                try:
                    if now - entry.stat(follow_symlinks=False).st_mtime > TMP_STALE_S:
                        os.unlink(entry.path)
                except FileNotFoundError:           # another process's file, gone meanwhile (its probe)
                    pass
        except OSError as e:
            raise StoreError("voice_store_unavailable", f"the voice store {self.root} cannot be written: "
                             f"{e.strerror or e}", 500, disk_fault=e.errno in DISK_FAULTS) from None
        self._opened = True

    # ----- reading -----
    def get(self, key: str, who: Identity) -> StoredVoice | None:
        """A voice `who` may use, by id, else by name (case-insensitive, among its tenant's); None when there is
        none: one of another tenant is None too, as if it did not exist."""
        if not isinstance(key, str) or not key:
            return None
        if STORED_ID.match(key):
            voice = self.by_id(key)
            return voice if voice is not None and voice.visible_to(who) else None
        return self.by_name(key, who.tenant)

    def exists(self, key: str, who: Identity) -> bool:
        return self.get(key, who) is not None

    def by_id(self, voice_id: str) -> StoredVoice | None:
        if not STORED_ID.match(voice_id or ""):      # never a path made of what a client sent
            return None
        path = self.voices_dir / f"{voice_id}.json"
        try:
            st = os.stat(path)
        except OSError:
            self._forget(voice_id)
            return None
        return self._load(voice_id, path, st)

    def _forget(self, voice_id: str) -> None:
        with self._cache_lock:
            self._cache.pop(voice_id, None)

    def by_name(self, name: str, tenant: str) -> StoredVoice | None:
        try:
            target = os.readlink(self.names_dir / self._digest(name, tenant))
        except (OSError, ValueError):
            return None
        voice_id = Path(target).stem
        voice = self.by_id(voice_id)
        return (voice if voice is not None and voice.tenant == tenant and name_key(voice.name) == name_key(name.strip())
                else None)

    def list(self, who: Identity) -> list[StoredVoice]:
        """Every voice `who` may use, oldest first."""
        out = []
        try:
            entries = list(os.scandir(self.voices_dir))
        except OSError:
            return []
        for entry in entries:
            voice_id = entry.name[:-5] if entry.name.endswith(".json") else ""
            if not STORED_ID.match(voice_id):
                continue
            try:
                st = entry.stat()
            except OSError:
                continue
            voice = self._load(voice_id, Path(entry.path), st)
            if voice is not None and voice.visible_to(who):
                out.append(voice)
        return sorted(out, key=lambda v: (v.created_at, v.id))

    def count_of(self, tenant: str) -> int:
        """The voices `tenant` owns (each file parsed once, then cached: call it on a worker thread)."""
        n = 0
        try:
            entries = list(os.scandir(self.voices_dir))
        except OSError:
            return 0
        for entry in entries:
            voice_id = entry.name[:-5] if entry.name.endswith(".json") else ""
            try:
                voice = self._load(voice_id, Path(entry.path), entry.stat()) if STORED_ID.match(voice_id) else None
            except OSError:
                continue
            n += voice is not None and voice.tenant == tenant
        return n

    def count(self) -> int:
        try:
            return sum(1 for e in os.scandir(self.voices_dir) if e.name.endswith(".json"))
        except OSError:
            return 0

    def _load(self, voice_id: str, path: Path, st: os.stat_result) -> StoredVoice | None:
        sig = (st.st_ino, st.st_size, st.st_mtime_ns)
        with self._cache_lock:
            hit = self._cache.get(voice_id)
            if hit is not None and hit[0] == sig:
                self._cache.move_to_end(voice_id)
                return hit[1]
        try:
            voice = StoredVoice.from_record(json.loads(path.read_bytes()))
            if voice.id != voice_id:
                raise ValueError(f"its id is {voice.id!r}")
        except FileNotFoundError:
            self._forget(voice_id)
            return None
        except Exception as e:                   # a damaged file is skipped, never served
            log.warning("voice store: %s is unreadable (%s): skipped", path, e)
            return None
        with self._cache_lock:
            self._cache[voice_id] = (sig, voice)
            while len(self._cache) > CACHE:
                self._cache.popitem(last=False)
        return voice

    # ----- writing -----
    def claim(self, name: str, tenant: str = DEFAULT_TENANT) -> Claim:
        """Claim a name among `tenant`'s voices for a new voice of it; StoreError: invalid_name, voice_exists (409: taken, or an upload of
        it in flight), voice_limit_reached, voice_store_unavailable."""
        name = check_name(name)
        if not self._opened:
            self.open()
        if self.count() >= self.max_voices:
            raise StoreError("voice_limit_reached", f"the voice store holds {self.max_voices} voices, its limit: "
                             "delete one first")
        voice_id = new_voice_id()
        path = self.names_dir / self._digest(name, tenant)
        claim = Claim(self, voice_id, name, tenant, path)
        for _ in range(2):
            try:
                os.symlink(claim.target, path)
                return claim
            except FileExistsError:
                pass
            except OSError as e:
                raise StoreError("voice_store_unavailable", f"the voice store cannot be written: {e.strerror or e}",
                                 500) from None
            other = self.by_name(name, tenant)
            if other is not None:
                raise StoreError("voice_exists", f"a voice named {other.name!r} exists already (id {other.id}): "
                                 "delete it first, or choose another name", 409)
            try:
                age = time.time() - os.lstat(path).st_mtime
            except FileNotFoundError:
                continue                            # released meanwhile: try again
            if age < STALE_S:
                raise StoreError("voice_exists", f"a voice named {name!r} is being created by another request", 409)
            # a crash's leftover: replace it by a rename (atomic), then make sure it is ours
            tmp = self.tmp_dir / f"claim.{voice_id}"
            try:
                os.symlink(claim.target, tmp)
                os.replace(tmp, path)
            except OSError as e:
                raise StoreError("voice_store_unavailable", f"the voice store cannot be written: {e.strerror or e}",
                                 500) from None
            if claim.owned():
                log.info("voice store: took over the stale claim on the name %r", name)
                return claim
        raise StoreError("voice_exists", f"a voice named {name!r} is being created by another request", 409)

    def write(self, voice: StoredVoice, claim: Claim) -> None:
        data = json.dumps(voice.record(), separators=(",", ":")).encode()
        tmp = self.tmp_dir / f"{voice.id}.{os.getpid()}.json"
        final = self.voices_dir / f"{voice.id}.json"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if not claim.owned():
                os.unlink(tmp)
                raise StoreError("voice_exists", f"the name {voice.name!r} was taken over while its voice was made "
                                 "(a stale claim): try again", 409)
            os.replace(tmp, final)
            _fsync_dir(self.voices_dir)
        except OSError as e:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise StoreError("voice_store_unavailable", f"the voice could not be stored: {e.strerror or e}",
                             500) from None

    def delete(self, voice_id: str) -> StoredVoice | None:
        """Remove a voice (its id stops resolving at once, then its name is free); None if there was none."""
        voice = self.by_id(voice_id)
        if voice is None:
            return None
        try:
            os.unlink(self.voices_dir / f"{voice_id}.json")
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError("voice_store_unavailable", f"the voice could not be deleted: {e.strerror or e}",
                             500) from None
        self._forget(voice_id)
        name = self.names_dir / self._digest(voice.name, voice.tenant)
        try:
            if os.readlink(name) == f"../voices/{voice_id}.json":
                os.unlink(name)
        except OSError:
            pass
        _fsync_dir(self.voices_dir)
        return voice

    @staticmethod
    def _digest(name: str, tenant: str) -> str:
        key = name_key(name.strip())
        if tenant != DEFAULT_TENANT:        # a tenant's name never contains a newline (server/keys.py NAME)
            key = f"{tenant}\n{key}"
        return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def new_voice_id() -> str:
    return VOICE_ID_PREFIX + secrets.token_hex(8)


def _fsync_dir(path: Path) -> None:
    """Make a rename or unlink in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
