"""The fuzz suite's field contracts (tests/fuzz/mutate.py) against the translators that enforce them: for every value
the mutator may put in a contracted field, the contract calls it bad exactly when the translator refuses it. A
contract looser than the code hides a refusal the fuzzer cannot check; a stricter one makes the fuzz suite fail a
server that is right. The fields recently honoured: ElevenLabs voice_settings and chunk_length_schedule, Cartesia's
delivery controls. (A style or emotion becomes an instruction, refused on the fuzz servers' checkpoint, which
takes none: refused here too.)"""
from __future__ import annotations

import json

import pytest

from talkgate.sessions import cartesia, elevenlabs
from talkgate.sessions.fields import SessionError
from tests.fuzz import mutate as M

POOL = list(M.ODD_NUMBERS + M.ODD_VALUES + M.ODD_STRINGS + M.CONTROL_TOKENS) + [
    0.7, 1.2, 0.6, 1.5, 0.5, 2, 50, 500, 49, 501, 5000, 5001, 0.25, "neutral", "happy", "slow", "fast", "normal",
    [50], [50, 500], [49], [120, 600], [True], [50.0]]


def refused(call) -> bool:
    try:
        out = call()
    except SessionError:
        return True
    return bool(out and out.get("expression"))     # an instruction: refused where the model takes none


def judged(contract: M.F, field: str, seed: dict, call) -> list[str]:
    wrong = []
    for value in POOL:
        obj = json.loads(json.dumps({**seed, field: value}))
        if contract.breaks(obj) != refused(lambda: call(obj)):
            wrong.append(f"{field}={value!r}: contract says {'bad' if contract.breaks(obj) else 'fine'}")
    return wrong


@pytest.mark.parametrize("field", list(M.EL_VOICE_SETTINGS.sub))
def test_elevenlabs_voice_settings_contract(field):
    seed = {"stability": 0.5, "similarity_boost": 0.8, "speed": 1.1, "style": 0, "use_speaker_boost": True}
    assert judged(M.EL_VOICE_SETTINGS, field, seed, lambda s: elevenlabs.voice_settings({"voice_settings": s})) == []


def test_elevenlabs_chunk_length_schedule_contract():
    assert judged(M.EL_GENERATION_CONFIG, "chunk_length_schedule", {},
                  lambda g: elevenlabs.generation_config({"generation_config": g})) == []


@pytest.mark.parametrize("field", list(M.CARTESIA_CONTRACTS["message"]["generation_config"].sub))
def test_cartesia_generation_config_contract(field):
    contract = M.CARTESIA_CONTRACTS["message"]["generation_config"]
    seed = {"speed": 1.2, "volume": 1.5, "emotion": "neutral"}
    assert judged(contract, field, seed, lambda g: cartesia.controls({"generation_config": g}, "c")) == []


@pytest.mark.parametrize("field", ["speed", "max_buffer_delay_ms", "use_normalized_timestamps",
                                   "add_phoneme_timestamps"])
def test_cartesia_delivery_fields_contract(field):
    contracts = M.CARTESIA_CONTRACTS["message"]
    top = M.F("obj", sub={field: contracts[field]})
    assert field in M.CARTESIA_PROTOCOL.opener_only
    assert judged(top, field, {}, lambda m: cartesia.controls(m, "c")) == []


def test_seed_scripts_keep_their_contracts():
    """Every seed message is valid under its contract (a mutation then changes one thing)."""
    for protocol in (M.EL_MULTI_PROTOCOL, M.EL_SINGLE_PROTOCOL, M.CARTESIA_PROTOCOL, M.DASHSCOPE_PROTOCOL):
        m = M.Mutator(__import__("random").Random(0), protocol, 16384)
        for script in protocol.scripts:
            for i, msg in enumerate(script):
                assert not m._bad(json.loads(json.dumps(msg).replace("{C}", "c1")), opener=(i == 0)), msg
