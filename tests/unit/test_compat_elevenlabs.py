"""ElevenLabs stream-input / multi-stream-input translator, Sans-I/O: messages in, engine commands and
wire messages out, engine events built in the test (tests/compat_harness.py)."""
from __future__ import annotations

import base64

import pytest

from talkgate.sessions.actions import Close, Purge
from talkgate.sessions.elevenlabs import ElevenLabsProtocol, parse_output_format
from talkgate.sessions.fields import SessionError
from talkgate.sessions.voices import VoiceMap, Voices, VoiceScope
from talkgate.synth.api import CancelContext
from tests.compat_harness import INFO, Harness, jsons


def make(tokenizer, query=None, voice_id="v1", multi=True, authenticate=None, voices=None):
    voices = voices or VoiceMap({"elevenlabs": {"v1": INFO.voices[0]}})
    q = {"output_format": "pcm_16000", **(query or {})}
    h = Harness(tokenizer, lambda s: ElevenLabsProtocol(s, "s1", voice_id, q, voices, multi, authenticate))
    h.ready()
    return h


def audio_messages(items):
    return [m for m in jsons(items) if m.get("audio")]


def alignment_text(items):
    return "".join("".join(m["alignment"]["chars"]) for m in jsons(items) if m.get("alignment"))


def test_turn_flush_then_close_context_finishes_with_alignment(tokenizer):
    h = make(tokenizer)
    assert h.send({"text": " ", "context_id": "c1", "voice_settings": {"stability": 0.5}}) == []
    h.send({"text": "Hi ", "context_id": "c1"})
    h.send({"text": "there. ", "context_id": "c1"})
    h.send({"context_id": "c1", "flush": True})
    h.send({"context_id": "c1", "close_context": True})       # pipecat's end of turn: audio must finish
    assert h.commands[0].params.voice == INFO.voices[0]
    h.finish(3)
    out = h.deliver()
    msgs = jsons(out)
    assert msgs[-1] == {"isFinal": True, "contextId": "c1"}
    audio = audio_messages(out)
    assert audio and all(m["contextId"] == "c1" and m["isFinal"] is False for m in audio)
    pcm = b"".join(base64.b64decode(m["audio"]) for m in audio)
    assert len(pcm) % 2 == 0 and len(pcm) >= 2 * 16000 * 0.08     # s16le at 16 kHz, at least one frame
    assert alignment_text(out) == "Hi there. "         # every character, the opening " " excluded
    for m in msgs:
        a = m.get("alignment")
        if a:
            assert len(a["chars"]) == len(a["charStartTimesMs"]) == len(a["charDurationsMs"])
            assert all(d >= 0 for d in a["charDurationsMs"]) and a["charStartTimesMs"] == sorted(a["charStartTimesMs"])
            assert m["normalizedAlignment"] == a


def test_alignment_clock_matches_audio_clock(tokenizer):
    """pipecat advances its word clock by each alignment span: the sum must not run past the audio."""
    h = make(tokenizer)
    h.send({"text": "One two three four five six seven. ", "context_id": "c"})
    h.send({"context_id": "c", "flush": True})
    h.send({"context_id": "c", "close_context": True})
    h.finish(6)
    out = h.deliver()
    audio_ms = sum(len(base64.b64decode(m["audio"])) / 32 for m in audio_messages(out))
    clock = sum(m["alignment"]["charStartTimesMs"][-1] + m["alignment"]["charDurationsMs"][-1]
                for m in jsons(out) if m.get("alignment"))
    assert clock <= audio_ms + 1


def test_close_context_without_flush_cancels(tokenizer):
    h = make(tokenizer)
    h.send({"text": "A long sentence that would take a while to say. ", "context_id": "c1"})
    (ctx,) = h.opened()
    h.audio(ctx, 2)
    actions = h.send({"context_id": "c1", "close_context": True})
    assert any(isinstance(a, Purge) for a in actions) and h.commands[-1] == CancelContext(ctx)
    assert h.queued() == [{"isFinal": True, "contextId": "c1"}]     # queued audio was purged
    h.audio(ctx, 2)
    assert h.queued() == [{"isFinal": True, "contextId": "c1"}]     # nothing of it follows


def test_text_after_flush_continues_the_context_in_order(tokenizer):
    h = make(tokenizer)
    h.send({"text": "First part. ", "context_id": "c", "flush": True})
    h.send({"text": "Second part. ", "context_id": "c"})
    h.send({"text": "", "context_id": "c", "flush": True})
    h.send({"context_id": "c", "close_context": True})
    h.finish()
    (ctx,) = h.opened()                     # one engine context: a flush keeps it open for the second part
    assert [type(c).__name__ for c in h.commands if getattr(c, "context", None) == ctx] == [
        "OpenContext", "AppendText", "FlushText", "AppendText", "FlushText", "EndText"]
    out = h.deliver()
    assert alignment_text(out) == "First part. Second part. "
    assert jsons(out)[-1] == {"isFinal": True, "contextId": "c"}


def test_keepalives_are_harmless(tokenizer):
    h = make(tokenizer)
    assert h.send({"text": ""}) == []                               # bare, before any context
    assert h.send({"text": "", "context_id": "nope"}) == []         # keepalive of a context not opened
    h.send({"text": "Hi. ", "context_id": "k"})
    assert h.send({"text": "", "context_id": "k"}) == []            # keepalive of an open context
    assert h.close is None


def test_five_context_limit(tokenizer):
    h = make(tokenizer)
    for i in range(5):
        h.send({"text": " ", "context_id": f"c{i}"})
    actions = h.send({"text": " ", "context_id": "c5"})
    assert jsons(h.queued())[-1] == {"message": "Maximum simultaneous contexts (5) exceeded: close a context before "
                                                "opening another", "error": "max_active_conversations", "code": 1008}
    assert actions[-1] == Close(1008, "max_active_conversations")


def test_closed_contexts_do_not_count_toward_the_limit(tokenizer):
    h = make(tokenizer)
    for i in range(7):          # each turn ends the pipecat way while its audio is still being made
        h.send({"text": "Hi. ", "context_id": f"t{i}", "flush": True})
        h.send({"context_id": f"t{i}", "close_context": True})
    assert h.close is None and not [m for m in h.queued() if "error" in m]


@pytest.mark.parametrize("msg, code", [
    ("{not json", "invalid_json"),
    ("[1, 2]", "invalid_message"),
    ({"text": 5, "context_id": "c"}, "invalid_message"),
    ({"text": "hello"}, "invalid_message"),                        # multi-stream needs context_id
    ({"context_id": "c"}, "invalid_message"),                      # nothing to do
    ({"context_id": "c", "flush": "yes"}, "invalid_message"),
    ({"context_id": "c", "close_context": True}, None),            # unknown context: just isFinal
])
def test_malformed_messages(tokenizer, msg, code):
    h = make(tokenizer)
    h.send(msg)
    (reply,) = h.queued()
    if code is None:
        assert reply == {"isFinal": True, "contextId": "c"}
    else:
        assert reply["error"] == code and reply["code"] == 1008 and reply["message"]
    assert h.close is None
    h.apply(h.proto.receive_binary(b"\x00"))
    assert h.queued()[-1]["error"] == "invalid_message"


def test_first_message_auth(tokenizer):
    h = make(tokenizer, authenticate=lambda k: scope() if k == "secret" else None)
    h.send({"text": " ", "context_id": "c", "xi_api_key": "wrong"})
    assert h.queued()[0]["error"] == "invalid_api_key" and h.close.code == 1008
    h = make(tokenizer, authenticate=lambda k: scope() if k == "secret" else None)
    h.send({"text": "Hi. ", "context_id": "c", "xi_api_key": "secret", "flush": True})
    h.finish()
    assert h.close is None and audio_messages(h.deliver())
    h = make(tokenizer, authenticate=lambda k: scope() if k == "secret" else None)
    h.send("{junk")                                            # the first message decides
    assert h.queued()[0]["error"] == "invalid_api_key" and h.close.code == 1008


def scope(table=None) -> VoiceScope:
    return VoiceScope(Voices(INFO), VoiceMap({"elevenlabs": table or {"v1": INFO.voices[0]}}))


def test_first_message_auth_looks_the_voice_up_among_the_clients_voices(tokenizer):
    """Before its key, a client is nobody: the voice of the URL is looked up with the scope its key gives."""
    nobody = VoiceMap({"elevenlabs": {}})       # v1 is unknown to a client not yet authenticated
    h = make(tokenizer, voices=nobody, authenticate=lambda k: scope() if k == "secret" else None)
    assert h.queued() == [] and h.close is None
    h.send({"text": "Hi. ", "context_id": "c", "xi_api_key": "secret", "flush": True})
    h.finish()
    assert h.close is None and audio_messages(h.deliver())
    # and a scope that does not know the voice: the error of an unknown voice, once authenticated
    h = make(tokenizer, authenticate=lambda k: scope({"other": None}) if k == "secret" else None)
    h.send({"text": "Hi. ", "context_id": "c", "xi_api_key": "secret"})
    assert h.queued()[0]["error"] == "voice_not_found" and h.close.code == 1008


@pytest.mark.parametrize("name, magic", [("mp3_22050_32", None), ("opus_48000_64", b"OggS")])
def test_compressed_output_formats(tokenizer, name, magic):
    h = make(tokenizer, {"output_format": name})
    h.send({"text": "Hi. ", "context_id": "c", "flush": True})
    h.send({"context_id": "c", "close_context": True})
    h.finish()
    data = b"".join(base64.b64decode(m["audio"]) for m in audio_messages(h.deliver()))
    if magic:
        assert data.startswith(magic)
    else:       # MPEG audio frame sync
        assert data[0] == 0xFF and data[1] & 0xE0 == 0xE0


def test_ulaw_output(tokenizer):
    h = make(tokenizer, {"output_format": "ulaw_8000"})
    h.send({"text": "Hi. ", "context_id": "c", "flush": True})
    h.send({"context_id": "c", "close_context": True})
    h.finish()
    ulaw = b"".join(base64.b64decode(m["audio"]) for m in audio_messages(h.deliver()))
    assert len(ulaw) % 640 == 0      # 80 ms frames of 8 kHz mu-law, one byte per sample


@pytest.mark.parametrize("query, voice_id, code", [
    ({"output_format": "pcm_12345"}, "v1", "invalid_output_format"),
    ({"output_format": "mp3_44100_999"}, "v1", "invalid_output_format"),
    ({"inactivity_timeout": "181"}, "v1", "invalid_inactivity_timeout"),
    ({"inactivity_timeout": "abc"}, "v1", "invalid_inactivity_timeout"),
    ({}, "no-such-voice", "voice_not_found"),
])
def test_bad_socket_parameters_close_1008(tokenizer, query, voice_id, code):
    h = make(tokenizer, query, voice_id)
    assert h.queued()[0]["error"] == code and h.close.code == 1008


def test_output_format_table():
    assert parse_output_format("pcm_44100").session.sample_rate == 44100
    assert parse_output_format("alaw_8000").session.encoding == "alaw"
    assert parse_output_format("mp3_44100_128").container == "mp3"
    with pytest.raises(SessionError):
        parse_output_format("ulaw_16000")


def test_inactivity_timeout(tokenizer):
    """inactivity_timeout sets the connection's idle time (no message, no audio taken: server/connection.py)."""
    h = make(tokenizer, {"inactivity_timeout": "60"})
    assert h.proto.idle_timeout_s == 60
    h.apply(h.proto.idle_timeout())
    assert h.queued()[0]["error"] == "input_timeout_exceeded" and h.close.code == 1008
    for bad in ("0", "181", "²", "1e3", " 60"):
        h = make(tokenizer, {"inactivity_timeout": bad})
        assert h.close.code == 1008 and h.queued()[0]["error"] == "invalid_inactivity_timeout"


def test_close_socket_cancels_and_closes(tokenizer):
    h = make(tokenizer)
    h.send({"text": "Some words to say. ", "context_id": "c", "flush": True})
    (ctx,) = h.opened()
    h.audio(ctx, 1)
    actions = h.send({"close_socket": True})
    assert any(isinstance(a, Purge) for a in actions) and h.close == Close(1000, "close_socket")
    assert h.commands[-1] == CancelContext(ctx)


def test_stream_input_single_utterance(tokenizer):
    h = make(tokenizer, multi=False)
    h.send({"text": " ", "voice_settings": {}, "generation_config": {"chunk_length_schedule": [50]}})
    h.send({"text": "Hi there. ", "flush": True})
    h.send({"text": ""})
    h.finish()
    out = h.deliver()
    assert audio_messages(out) and all("contextId" not in m for m in jsons(out))
    assert jsons(out)[-1] == {"isFinal": True} and h.close == Close(1000, "done")
    assert alignment_text(out) == "Hi there. "


def test_stream_input_text_after_end_is_an_error(tokenizer):
    h = make(tokenizer, multi=False)
    h.send({"text": "Hi. "})
    h.send({"text": ""})
    h.send({"text": "more"})
    assert h.queued()[-1]["error"] == "context_closed"
