"""The voice store (server/voice_store.py) on a real directory, several processes at once; reference audio as
clients upload it (sessions/reference_audio.py); what a voice means to a session (sessions/voices.py, Sans-I/O)."""
from __future__ import annotations

import base64
import errno
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile

from talkgate.server import voice_store as voice_store_module
from talkgate.server.keys import OPEN
from talkgate.server.voice_store import StoredVoice, StoreError, VoiceStore
from talkgate.sessions.fields import SessionError
from talkgate.sessions.limits import Limits
from talkgate.sessions.reference_audio import AudioError, check_ref_text, decode_inline, join, read_clip
from talkgate.sessions.session import (
    ContextConfig, ContextError, ContextStarted, Reference, Session,
)
from talkgate.sessions.voices import STORED_ID, UnknownVoice, VoiceMap, Voices
from talkgate.synth.api import (
    AppendText, CancelContext, EndText, MakeVoice, ModelInfo, OpenContext, VoiceFailed, VoiceMade, VoicePrompt,
)
from talkgate.synth.voice import to_mono_24k
from tests.voicetools import voiced

PROMPT = VoicePrompt.from_arrays(np.arange(8, dtype=np.float32))
ICL = VoicePrompt.from_arrays(np.ones(8, np.float32), np.arange(32).reshape(2, 16), "Some words.")


# ----- the store -----
def test_save_get_list_delete_and_restart(tmp_path):
    store = VoiceStore(tmp_path / "store")
    assert store.list(OPEN) == [] and store.get("anything", OPEN) is None      # nothing made before the first upload
    with store.claim("  Brand Voice ") as claim:
        voice = claim.save(ICL, description="ours", language="en", source={"seconds": 2.0})
    assert STORED_ID.match(voice.id) and voice.name == "Brand Voice" and voice.mode == "icl"
    other = store.claim("other")
    other.save(PROMPT)
    for key in (voice.id, "brand voice", "BRAND VOICE", " Brand Voice"):
        assert store.get(key, OPEN) == voice, key
    # a new process (a restart, another worker) reads the same
    again = VoiceStore(tmp_path / "store")
    assert [v.id for v in again.list(OPEN)] == [voice.id, other.voice.id]
    assert again.get(voice.id, OPEN) == voice and again.get(voice.id, OPEN).prompt == ICL
    # the record is JSON: what it was made from, the prompt as base64
    record = json.loads((tmp_path / "store" / "voices" / f"{voice.id}.json").read_text())
    assert record["format"] == "talkgate.voice/1" and record["ref_text"] == "Some words."
    assert base64.b64decode(record["codes"]) == ICL.codes
    assert oct(os.stat(tmp_path / "store" / "voices").st_mode & 0o777) == "0o700"
    # deleted: gone for every process at once (the other instance had it cached), and its name is free
    assert again.delete(voice.id) == voice
    assert store.get(voice.id, OPEN) is None and store.get("Brand Voice", OPEN) is None and again.delete(voice.id) is None
    with store.claim("brand voice") as claim:
        renewed = claim.save(PROMPT)
    assert renewed.id != voice.id and again.get("Brand voice", OPEN) == renewed


def test_names_are_unique_and_checked(tmp_path):
    store = VoiceStore(tmp_path)
    store.claim("Ana").save(PROMPT)
    for name, code in (("ana", "voice_exists"), ("ＡＮＡ", "voice_exists"), ("", "invalid_name"), ("  ", "invalid_name"),
                       ("x" * 101, "invalid_name"), ("tab\there", "invalid_name"), (None, "invalid_name")):
        with pytest.raises(StoreError) as e:
            store.claim(name)
        assert e.value.code == code, name
    assert store.get("ＡＮＡ", OPEN).name == "Ana"
    # a claim in flight holds the name; released without a save, the name is free and nothing was stored
    claim = store.claim("Ben")
    with pytest.raises(StoreError, match="is being created by another request") as e:
        store.claim("ben")
    assert e.value.status == 409
    claim.release()
    assert store.get("Ben", OPEN) is None and len(store.list(OPEN)) == 1
    store.claim("ben").release()
    # the store's limit
    small = VoiceStore(tmp_path, max_voices=1)
    with pytest.raises(StoreError, match="holds 1 voices, its limit"):
        small.claim("Cy")


CLAIMER = """
import json, os, sys, time
import numpy as np
from talkgate.server.voice_store import StoreError, VoiceStore
from talkgate.synth.api import VoicePrompt
root, start = sys.argv[1], float(sys.argv[2])
store = VoiceStore(root)
while time.time() < start:
    pass
try:
    with store.claim("Same Name") as claim:
        time.sleep(0.05)
        print(json.dumps(["saved", claim.save(VoicePrompt.from_arrays(np.ones(4, np.float32))).id]))
except StoreError as e:
    print(json.dumps([e.code, e.status]))
"""


def test_concurrent_uploads_of_one_name_from_processes(tmp_path):
    """Six processes claim one name at the same moment: exactly one stores a voice, the others get 409."""
    start = time.time() + 1.5
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path), str(start)], stdout=subprocess.PIPE,
                              text=True) for _ in range(6)]
    results = [tuple(json.loads(p.communicate(timeout=60)[0])) for p in procs]
    saved = [r for r in results if r[0] == "saved"]
    assert len(saved) == 1 and sorted(r for r in results if r[0] != "saved") == [("voice_exists", 409)] * 5
    assert [v.id for v in VoiceStore(tmp_path).list(OPEN)] == [saved[0][1]]


def test_crash_leftovers(tmp_path, monkeypatch):
    store = VoiceStore(tmp_path)
    # a claim whose upload crashed: held while young, taken over once stale
    crashed = store.claim("Dee")
    with pytest.raises(StoreError, match="being created"):
        store.claim("Dee")
    old = time.time() - voice_store_module.STALE_S - 1
    os.utime(crashed.path, (old, old), follow_symlinks=False)
    taken = store.claim("dee")
    assert taken.owned() and not crashed.owned()
    # the crashed upload cannot publish over it, nor give its name back
    with pytest.raises(StoreError, match="taken over"):
        crashed.save(PROMPT)
    crashed.release()
    assert taken.owned() and store.list(OPEN) == []
    taken.save(PROMPT)
    # a half-written file in tmp/ is never read, and an old one goes when a store opens
    (tmp_path / "tmp" / "voice_0123456789abcdef.99.json").write_text('{"format": "talkgate.vo')
    stale = tmp_path / "tmp" / "voice_fedcba9876543210.98.json"
    stale.write_text("{")
    os.utime(stale, (old - 3600, old - 3600))
    VoiceStore(tmp_path).open()
    assert not stale.exists() and [v.name for v in store.list(OPEN)] == ["dee"]
    # a damaged voice file is skipped (and logged), never served
    bad = tmp_path / "voices" / "voice_00000000000000aa.json"
    bad.write_text('{"format": "talkgate.voice/1", "id": "voice_00000000000000aa"}')
    assert store.get("voice_00000000000000aa", OPEN) is None and len(store.list(OPEN)) == 1


def test_lookups_never_make_paths_of_client_strings(tmp_path):
    store = VoiceStore(tmp_path)
    (tmp_path / "secret.json").write_text("{}")
    for key in ("../secret", "voice_../../x", "/etc/passwd", "voice_0123456789abcdeF", "", "\x00"):
        assert store.get(key, OPEN) is None and store.by_id(key) is None


def test_store_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreError) as e:
        VoiceStore(tmp_path / "file" / "store").claim("x")
    assert e.value.code == "voice_store_unavailable" and e.value.status == 500
    assert not e.value.disk_fault             # a wrong path: `serve --voice-store` refuses to start


@pytest.mark.parametrize("err", [errno.EROFS, errno.ENOSPC])
def test_store_on_a_read_only_or_full_disk_is_a_disk_fault(tmp_path, monkeypatch, err):
    """`serve` starts on such a store (the soak's read-only fault, issue 50): its voices are served, uploads refused."""
    def refuse(self, data):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(voice_store_module.Path, "write_bytes", refuse)
    with pytest.raises(StoreError) as e:
        VoiceStore(tmp_path).open()
    assert e.value.code == "voice_store_unavailable" and e.value.disk_fault


def test_stored_voice_record_round_trip():
    v = StoredVoice("voice_0123456789abcdef", "N", 1.5, ICL, labels={"accent": "x"}, consent="c", api="cartesia")
    assert StoredVoice.from_record(json.loads(json.dumps(v.record()))) == v
    assert "embedding" not in v.public() and v.public()["mode"] == "icl"


# ----- reference audio -----
def encoded(fmt: str, subtype: str, audio: np.ndarray, rate: int) -> bytes:
    b = io.BytesIO()
    soundfile.write(b, audio, rate, format=fmt, subtype=subtype)
    return b.getvalue()


@pytest.mark.parametrize("fmt,subtype,rate", [("WAV", "PCM_16", 16000), ("WAV", "FLOAT", 24000), ("FLAC", "PCM_24", 44100),
                                              ("OGG", "VORBIS", 22050), ("OGG", "OPUS", 48000),
                                              ("MP3", "MPEG_LAYER_III", 24000), ("WAV", "ULAW", 8000)])
def test_formats_read_as_mono_24k(fmt, subtype, rate):
    stereo = np.stack([voiced(1, 2.5, rate), voiced(2, 2.5, rate)], axis=1)
    clip = read_clip(encoded(fmt, subtype, stereo, rate))
    assert clip.channels == 2 and clip.sample_rate == rate and clip.format.startswith(fmt)
    assert clip.samples.dtype == np.float32 and abs(clip.seconds - 2.5) < 0.1
    if fmt in ("WAV", "FLAC") and subtype != "ULAW":       # lossless: the reference's mix and resampling
        decoded, _ = soundfile.read(io.BytesIO(encoded(fmt, subtype, stereo, rate)), dtype="float32")
        np.testing.assert_array_equal(clip.samples, to_mono_24k(decoded, rate))


def test_bad_reference_audio():
    wav = lambda seconds, rate=16000, amp=1.0: encoded("WAV", "PCM_16", amp * voiced(3, seconds, rate), rate)
    cases = [(b"", "invalid_audio", 400, "empty"), (b"plain text, not a sound" * 20, "invalid_audio", 400, "not audio"),
             (b"\x00\x00\x00\x18ftypM4A " + bytes(500), "unsupported_audio_format", 415, "MP4/M4A"),
             (b"\x1a\x45\xdf\xa3" + bytes(500), "unsupported_audio_format", 415, "WebM"),
             (b"\xff\xf1\x50\x80" + bytes(500), "unsupported_audio_format", 415, "ADTS"),
             (wav(0.6), "audio_too_short", 400, "0.60 s"), (wav(31, 8000), "audio_too_long", 400, "over 30 s"),
             (wav(3, amp=0.0005), "audio_silent", 400, "silent"),
             (encoded("WAV", "PCM_16", np.zeros((24000, 2)), 24000), "audio_silent", 400, "silent"),
             (bytes(10 * 1024 * 1024 + 1), "audio_too_large", 413, "10 MB"),
             (wav(3)[:2000], "audio_too_short", 400, "s; it must")]
    for data, code, status, message in cases:
        with pytest.raises(AudioError) as e:
            read_clip(data, "the upload")
        assert (e.value.code, e.value.status) == (code, status) and message in e.value.message, (code, e.value.message)
    # 20 minutes in a 5 MB file are not decoded past 30.5 s
    long = encoded("FLAC", "PCM_16", np.tile(0.3 * np.sin(np.arange(8000) * np.pi / 20), 1200), 8000)
    t = time.perf_counter()
    with pytest.raises(AudioError, match="over 30 s"):
        read_clip(long)
    assert time.perf_counter() - t < 5


def test_several_files_join():
    a, b = (read_clip(encoded("WAV", "PCM_16", voiced(i, s, 24000), 24000)) for i, s in ((5, 1.2), (6, 2.0)))
    both = join([a, b])
    assert abs(both.seconds - 3.2) < 0.01 and len(both.samples) == len(a.samples) + len(b.samples)
    with pytest.raises(AudioError, match="all files together"):
        join([a] * 26)


def test_inline_audio_fields():
    data = encoded("WAV", "PCM_16", voiced(7, 1.5, 16000), 16000)
    b64 = base64.b64encode(data).decode()
    for value in (b64, "data:audio/wav;base64," + b64, "data:;base64," + b64, "data:audio/wav;codecs=1;base64," + b64):
        assert decode_inline(value, 1 << 20) == data
    for value, message in ((None, "data URL"), ("data:audio/wav," + b64, "must be base64"), ("***", "not valid base64"),
                           ("https://example.com/a.wav", "URLs are not fetched")):
        with pytest.raises(SessionError, match=message):
            decode_inline(value, 1 << 20)
    with pytest.raises(AudioError) as e:
        decode_inline(b64, 1000)
    assert e.value.code == "audio_too_large"
    assert check_ref_text("  Hi.  ") == "Hi." and check_ref_text(" ") is None
    with pytest.raises(SessionError) as e:
        check_ref_text("x" * 2001)
    assert e.value.code == "reference_text_too_long"


# ----- what a voice means to a session -----
class Found:
    def __init__(self, voice_id, name, prompt, model=None):
        self.id, self.name, self.prompt, self.model = voice_id, name, prompt, model or {}


BASE = ModelInfo("tiny-base", "base", "tiny", True, (), ("auto", "english"))
CUSTOM = ModelInfo("tiny", "custom_voice", "tiny", True, ("ryan", "serena"), ("auto", "english"))
STORED = {"voice_00000000000000a1": Found("voice_00000000000000a1", "Brand", PROMPT)}


def lookup(key):
    return next((v for k, v in STORED.items() if key in (k,) or key.lower() == v.name.lower()), None)


class Tokenizer:
    pending = ""            # what the session reads of a streaming tokenizer besides feed and finish

    def feed(self, text):
        return [len(text)]

    def finish(self):
        return [0]


def session(info=BASE, **defaults):
    return Session(info, Limits(), Tokenizer, ContextConfig(**defaults), voices=Voices(info, lookup))


def test_session_speaks_a_stored_voice_by_id_or_name():
    s = session(voice="brand")
    assert s.defaults.voice == "voice_00000000000000a1"
    (out,) = s.start("a")
    assert isinstance(out, ContextStarted)
    (cmd,) = s.take_commands()
    assert cmd == OpenContext(cmd.context, cmd.params) and cmd.params.voice_prompt == PROMPT
    assert cmd.params.voice is None
    s.start("b", voice="voice_00000000000000a1")
    assert s.take_commands()[0].params.voice_prompt == PROMPT
    for voice, code, message in (("voice_00000000000000ff", "unknown_voice", "deleted, or never stored"),
                                 ("nobody", "unknown_voice", "speaks cloned voices")):
        with pytest.raises(SessionError) as e:
            s.start("c", voice=voice)
        assert e.value.code == code and message in e.value.message
    # deleted after session.config: the next context says so
    STORED["gone"] = STORED.pop("voice_00000000000000a1")
    try:
        with pytest.raises(SessionError, match="deleted"):
            s.start("d")
    finally:
        STORED["voice_00000000000000a1"] = STORED.pop("gone")
    # a model that cannot speak cloned voices says why
    with pytest.raises(SessionError) as e:
        session(CUSTOM).start("e", voice="Brand")
    assert e.value.code == "invalid_voice" and "needs a Base checkpoint" in e.value.message
    custom = session(CUSTOM)
    custom.start("f", voice="Ryan")
    assert custom.take_commands()[0].params.voice == "ryan"


def test_a_stored_voice_goes_to_the_base_models_of_its_maker(monkeypatch):
    """A cloned voice is valid on the Base checkpoints of its maker's voice_key (speaker encoder and speech
    tokenizer encoder): routed there when no model is named; named elsewhere, refused with the reason."""
    from talkgate.sessions.models import Model, Models

    small, other = (ModelInfo("ckpt/0.6b-base", "base", "0b6", False, (), ("auto",), voice_key=k) for k in ("k1", "k2"))
    models = Models([Model("cv", CUSTOM), Model("other", other), Model("small", small), Model("twin", small)])
    made_by = {"name": "ckpt/0.6b-base", "size": "0b6", "voice_key": "k1"}
    monkeypatch.setitem(STORED, "voice_00000000000000b2", Found("voice_00000000000000b2", "Jo", PROMPT, made_by))
    s = Session(CUSTOM, Limits(), Tokenizer, voices=Voices(CUSTOM, lookup), models=models)
    assert models.cloner.name == "other" and models.maker("twin").name == "twin"
    s.start("a", voice="Jo")
    s.start("b", voice="jo", model="twin")
    s.start("c", voice="voice_00000000000000a1")        # stored before voice keys: any Base model
    assert [c.model for c in s.take_commands()] == ["small", "twin", "other"]
    for model, message in (("other", "valid only on the checkpoint that made it"), ("cv", "needs a Base checkpoint")):
        with pytest.raises(SessionError) as e:
            s.start("d", voice="Jo", model=model)
        assert e.value.code == "invalid_voice" and message in e.value.message
    with pytest.raises(SessionError) as e:
        models.maker("cv")
    assert e.value.code == "cloning_unavailable" and "model cv is custom_voice" in e.value.message


def test_session_with_reference_audio_opens_once_its_voice_is_made():
    s = session()
    ref = Reference(np.zeros(24000, np.float32).tobytes(), "Words.")
    s.start("a", reference=ref)
    (cmd,) = s.take_commands()
    ctx = cmd.request
    assert cmd == MakeVoice(ctx, ref.audio, "Words.")
    assert s.append("a", "Hello") == [] and s.end_text("a") == []          # text waits for the voice
    assert s.take_commands() == []
    made = VoicePrompt.from_arrays(np.ones(8, np.float32))
    assert s.on_engine_event(VoiceMade(ctx, made, 3.0)) == []
    out = s.take_commands()
    assert [type(c) for c in out] == [OpenContext, AppendText, EndText] and out[0].context == ctx
    assert out[0].params.voice_prompt == made
    # a refused voice ends the context (nothing was opened in the engine: no cancel)
    s.start("b", reference=ref)
    (cmd,) = s.take_commands()
    out = s.on_engine_event(VoiceFailed(cmd.request, "invalid_params", "reference text too long"))
    assert out == [ContextError("b", "invalid_params", "reference text too long", fatal=True, stream=2)]
    assert s.take_commands() == []
    # cancelled while its voice is made: its cancel goes out (the engine's client drops the late answer)
    s.start("c", reference=ref)
    (cmd,) = s.take_commands()
    s.cancel("c")
    assert s.take_commands() == [CancelContext(cmd.request)] and "c" not in s.active
    with pytest.raises(SessionError, match="needs a Base checkpoint"):
        session(CUSTOM).start("d", reference=ref)


def test_voice_map_resolves_stored_voices():
    stored = {"voice_00000000000000a1", "Brand"}.__contains__
    m = VoiceMap({"elevenlabs": {"mapped": "Brand", "*": None}}, stored=stored)
    assert m.resolve("elevenlabs", "voice_00000000000000a1", ()) == "voice_00000000000000a1"
    assert m.resolve("elevenlabs", "Brand", ()) == "Brand"
    assert m.resolve("elevenlabs", "mapped", ()) == "Brand"              # a table entry naming a stored voice
    assert m.resolve("elevenlabs", "other", ()) is None                  # a model without voices: its default
    assert m.resolve("cartesia", "voice_00000000000000ff", ()) == "voice_00000000000000ff"   # deleted: the session says so
    assert m.resolve("elevenlabs", "voice_00000000000000a1", ("ryan",)) == "voice_00000000000000a1"
    with pytest.raises(UnknownVoice):
        VoiceMap(stored=stored).resolve("deepgram", "aura-nobody", ("ryan",))
    assert re.fullmatch(STORED_ID, "voice_0123456789abcdef")


def test_tenants_own_their_voices_and_a_store_made_before_tenants_is_the_default_tenants(tmp_path):
    from talkgate.server.keys import Identity
    acme, beta, admin = Identity("a-1", "acme"), Identity("b-1", "beta"), Identity("ops-1", "ops", "admin")
    default_user = Identity("d-1", "default")
    store = VoiceStore(tmp_path)
    mine = store.claim("Narrator", "acme").save(PROMPT, key_id="a-1")
    theirs = store.claim("narrator", "beta").save(PROMPT)           # names are per tenant
    assert (mine.tenant, mine.key_id, theirs.tenant) == ("acme", "a-1", "beta")
    assert store.get("narrator", acme) == mine and store.get("Narrator", beta) == theirs
    assert store.get(mine.id, beta) is None and store.get(theirs.id, acme) is None      # as if it did not exist
    assert store.get(mine.id, admin) == mine and store.get("narrator", admin) is None   # an admin: by id
    assert store.list(acme) == [mine] and store.list(admin) == [mine, theirs]
    assert mine.deletable_by(acme) and not mine.deletable_by(beta) and mine.deletable_by(admin)
    house = store.claim("House", "ops").save(PROMPT, shared=True)
    assert store.get(house.id, beta) == house and store.list(beta) == [theirs, house]
    assert not house.deletable_by(beta)
    # a record written before tenants (no tenant, key_id, shared) under the old name digest: the default tenant's
    old = {k: v for k, v in mine.record().items() if k not in ("tenant", "key_id", "shared")}
    old.update(id="voice_00000000000000b1", name="Legacy")
    (tmp_path / "voices" / "voice_00000000000000b1.json").write_text(json.dumps(old))
    digest = hashlib.sha256(b"legacy").hexdigest()[:40]
    os.symlink("../voices/voice_00000000000000b1.json", tmp_path / "names" / digest)
    legacy = store.get("legacy", default_user)
    assert legacy is not None and legacy.tenant == "default" and store.get("voice_00000000000000b1", OPEN) == legacy
    assert store.get("legacy", acme) is None and store.get(legacy.id, acme) is None


def test_a_claim_that_cannot_be_given_back_leaves_the_upload_its_own_error(tmp_path, monkeypatch, caplog):
    """A read-only disk during an upload (the soak's fault): the store's voice_store_unavailable is what the upload
    ends with, not the OSError of giving its name back (which the soak found as a traceback); the claim stays, to be
    taken over once stale as a crash's leftover."""
    store = VoiceStore(tmp_path)

    def refuse(path, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    with monkeypatch.context() as m, pytest.raises(StoreError) as e:
        with store.claim("x") as claim:
            m.setattr(voice_store_module.os, "unlink", refuse)
            raise StoreError("voice_store_unavailable", "the voice could not be stored: Read-only file system", 500)
    assert e.value.code == "voice_store_unavailable"
    assert os.path.lexists(claim.path) and "could not be given back" in caplog.text
