"""Voice cloning parity with the official reference (qwen_tts), fp32 on the CPU, tiny sizes.

A reference Base model (tiny Talker and speaker encoder, seeded, every 1-D weight perturbed) is written with
its own save_pretrained; the speech tokenizer (decoder and voice-cloning encoder) is written by talkgate's
writer and loaded by the reference's Qwen3TTSTokenizer, which must find every tensor it expects. The
reference clones through its own public path (Qwen3TTSModel.create_voice_clone_prompt, generate,
generate_voice_clone), talkgate through synth.voice.make_voice_prompt and synth.offline. Checked: the speaker
embedding (1e-4), the reference codes (equal), greedy generation for 32 frames in x-vector and ICL modes (all
16 codebooks equal, Talker and code-predictor logits within 1e-4 at every frame), and an ICL waveform decoded
as the reference does (reference frames as the decoder's left context, then cut).
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from talkgate.synth import checkpoint
from talkgate.synth.api import SamplingParams
from talkgate.synth.loader import load_tts
from talkgate.synth.offline import generate_codes, synthesize
from talkgate.synth.random_speech_tokenizer import write_random_codec_decoder
from talkgate.synth.voice import make_voice_prompt
from tests.reference import load_reference_tokenizer, ref, save_reference, tiny_config
from tests.voicetools import voiced

FRAMES = 32
TOL = 1e-4
NEVER_EOS = 3071          # inside the suppressed range: fixed-length runs (tests/parity/test_parity_talker.py)
GREEDY = SamplingParams(greedy=True)
TINY_DECODER = checkpoint._PRESETS["tiny"][2]
TINY_ENCODER = checkpoint._CLONE_PRESETS["tiny"][1]


pytestmark = pytest.mark.usefixtures("one_thread")


def wrapper_for(model, root):
    """The reference's public API object (Qwen3TTSModel) around a built model, with its processor."""
    from transformers import AutoTokenizer
    model.load_speech_tokenizer(load_reference_tokenizer(root / "speech_tokenizer"))
    processor = ref.Processor(tokenizer=AutoTokenizer.from_pretrained(str(root), fix_mistral_regex=True))
    return ref.TTSModel(model, processor, {})


@pytest.fixture(scope="module")
def clone(tmp_path_factory, tiny_checkpoint):
    root = tmp_path_factory.mktemp("ref_base")
    torch.manual_seed(5)
    model = ref.Qwen3TTSForConditionalGeneration(tiny_config("base")).eval()
    with torch.no_grad():
        for p in model.parameters():         # norm weights 1 and biases 0 would hide a swapped tensor
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
        # the reference draws convolutions with std 0.02, under which the speaker encoder's inner blocks barely
        # reach its output (a swapped Res2Net branch moved the x-vector by < 1e-4): std fan_in^-0.5 instead
        for p in model.speaker_encoder.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn_like(p) * p[0].numel() ** -0.5)
    save_reference(model, root)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(tiny_checkpoint / name, root / name)
    write_random_codec_decoder(root / "speech_tokenizer", TINY_DECODER, seed=3, encoder_config=TINY_ENCODER)
    wrapper = wrapper_for(model, root)
    return wrapper, load_tts(root)


def test_speech_tokenizer_layout_is_what_the_reference_loads(clone, tmp_path):
    wrapper, tts = clone
    weights = load_file(str(tts.path / "speech_tokenizer" / "model.safetensors"))
    state = wrapper.model.speech_tokenizer.model.state_dict()
    assert set(state) == set(weights)
    assert all(torch.equal(state[k], weights[k]) for k in weights)


@pytest.mark.parametrize("rate", [24000, 16000, 44100])
def test_speaker_embedding_matches_reference(clone, rate):
    wrapper, tts = clone
    audio = voiced(1, 2.3, rate)
    want = wrapper.create_voice_clone_prompt((audio, rate), x_vector_only_mode=True)[0].ref_spk_embedding
    vp = make_voice_prompt(tts, audio, rate)
    got = torch.from_numpy(vp.embedding_array().copy())
    assert vp.codes is None and got.shape == want.shape == (64,)
    assert want.std() > 0.05                               # not a degenerate embedding
    assert (got - want).abs().max() <= TOL
    other = make_voice_prompt(tts, voiced(2, 2.3, rate), rate).embedding_array()
    assert np.abs(other - vp.embedding_array()).max() > 100 * TOL


def test_stereo_is_mixed_to_mono(clone):
    _, tts = clone
    left, right = voiced(1, 1.5), voiced(2, 1.5)
    stereo = make_voice_prompt(tts, np.stack([left, right], axis=1), 24000, ref_text="Two channels.")
    mono = make_voice_prompt(tts, (left + right) / 2, 24000, ref_text="Two channels.")
    assert stereo == mono


@pytest.mark.parametrize("rate,seconds", [(24000, 2.5), (16000, 1.3)])
def test_reference_codes_match_reference(clone, rate, seconds):
    wrapper, tts = clone
    audio = voiced(3, seconds, rate)
    want = wrapper.create_voice_clone_prompt((audio, rate), ref_text="Some words.")[0].ref_code
    got = make_voice_prompt(tts, audio, rate, ref_text="Some words.").codes_array()
    assert want.shape == (int(np.ceil(seconds * 12.5)), 16)
    assert len(set(map(tuple, want.tolist()))) == want.shape[0] and len(want[:, 0].unique()) > 4   # codes vary
    assert np.array_equal(got, want.numpy())


def reference_generate(wrapper, text, language, item, frames=FRAMES):
    """The reference's greedy generate for one voice-clone prompt item: codes [frames, 16] and the raw
    logits of every frame (forward hooks on codec_head and the code predictor's heads)."""
    model = wrapper.model
    ids = wrapper._tokenize_texts([wrapper._build_assistant_text(text)])
    ref_ids = [wrapper._tokenize_texts([wrapper._build_ref_text(item.ref_text)])[0]] if item.icl_mode else [None]
    talker_logits, predictor_logits = [], [[] for _ in range(15)]
    hooks = [model.talker.codec_head.register_forward_hook(lambda m, i, o: talker_logits.append(o[0, -1].clone()))]
    for g, head in enumerate(model.talker.code_predictor.lm_head):
        hooks.append(head.register_forward_hook(lambda m, i, o, g=g: predictor_logits[g].append(o[0, -1].clone())))
    try:
        codes, _ = model.generate(input_ids=ids, ref_ids=ref_ids, languages=[language],
                                  voice_clone_prompt=wrapper._prompt_items_to_voice_clone_prompt([item]),
                                  max_new_tokens=frames + 1, eos_token_id=NEVER_EOS, do_sample=False,
                                  subtalker_dosample=False, repetition_penalty=1.05)
    finally:
        for h in hooks:
            h.remove()
    logits = [(talker_logits[n], torch.stack([predictor_logits[g][n] for g in range(15)])) for n in range(frames)]
    return codes[0], logits


def check_generation(clone, text, language, audio, rate, ref_text=None):
    wrapper, tts = clone
    item = wrapper.create_voice_clone_prompt((audio, rate), ref_text=ref_text, x_vector_only_mode=ref_text is None)[0]
    want, want_logits = reference_generate(wrapper, text, language, item)
    vp = make_voice_prompt(tts, audio, rate, ref_text=ref_text)
    logits = []
    got = generate_codes(tts, text, language=language, voice_prompt=vp, sampling=GREEDY, max_frames=FRAMES,
                         ignore_eos=True, logits=logits)
    assert want.shape == (FRAMES, 16)
    for n in range(FRAMES):
        assert (logits[n][0] - want_logits[n][0]).abs().max() <= TOL, f"Talker logits differ at frame {n}"
        assert (logits[n][1] - want_logits[n][1]).abs().max() <= TOL, f"code predictor logits differ at frame {n}"
    assert torch.equal(got, want), f"codes differ from frame {int((got != want).any(1).nonzero()[0])}"
    return item, vp


@pytest.mark.parametrize("language", ["auto", "english"])
def test_xvector_clone_generation_matches_reference(clone, language):
    check_generation(clone, "Hello world! This voice was cloned from a short clip.", language,
                     voiced(4, 2.0, 16000), 16000)


LONG_TEXT = ("The reference text and this text share one text track: when they outrun the reference frames, "
             "the rest is fed one token a frame, as the text of any other context is.")


@pytest.mark.parametrize("seconds,ref_text,text", [
    (1.1, "A short clip, but its transcript has more tokens than the clip has frames, by far.", LONG_TEXT),
    (3.0, "A longer clip with a short transcript.", "Short."),
])
def test_icl_clone_generation_matches_reference(clone, seconds, ref_text, text):
    _, tts = clone
    item, vp = check_generation(clone, text, "english", voiced(5, seconds), 24000, ref_text=ref_text)
    assert vp.frames == item.ref_code.shape[0]
    n_ref, n_text = len(tts.prompts.ref_text_ids(ref_text)), len(tts.prompts.tokenize_text(text)[1])
    # the two layouts the reference distinguishes: text track longer than the ICL positions, or padded
    assert (n_ref + n_text + 1 > vp.frames + 1) == (text == LONG_TEXT)


def test_icl_waveform_matches_reference(clone):
    """The reference decodes reference frames + generated frames as one sequence, then cuts int(ref_len /
    total_len * samples) samples: the reference frames' 1920 each, or one fewer when that float product rounds
    down (1 case in 24 of lengths up to 400 + 1500 frames). talkgate cuts the reference frames' samples."""
    wrapper, tts = clone
    audio, text, ref_text = voiced(6, 2.0), "Continue my voice.", "This is the reference clip."
    item = wrapper.create_voice_clone_prompt((audio, 24000), ref_text=ref_text)[0]
    (want,), sr = wrapper.generate_voice_clone(text, language="english", voice_clone_prompt=[item], do_sample=False,
                                               subtalker_dosample=False, max_new_tokens=FRAMES + 1,
                                               eos_token_id=NEVER_EOS)
    vp = make_voice_prompt(tts, audio, 24000, ref_text=ref_text)
    got, rate = synthesize(tts, text, language="english", voice_prompt=vp, sampling=GREEDY, max_frames=FRAMES,
                           ignore_eos=True)
    assert sr == rate == 24000 and len(got) == FRAMES * 1920 and len(want) - len(got) in (0, 1)
    assert np.std(want) > 0.01
    np.testing.assert_allclose(got, want[len(want) - len(got):], atol=TOL)
    # without the reference frames as left context the start differs: the context matters
    alone = tts.codec_decoder.decode(generate_codes(tts, text, language="english", voice_prompt=vp, sampling=GREEDY,
                                                    max_frames=FRAMES, ignore_eos=True).T[None])[0].numpy()
    assert np.abs(alone[:1920] - got[:1920]).max() > 10 * TOL


def test_talkgate_base_checkpoint_loads_in_reference(tmp_path):
    """`talkgate checkpoint create --variant base` writes the speaker encoder the reference expects."""
    root = checkpoint.create_checkpoint(tmp_path / "base", preset="tiny", variant="base")
    config = json.loads((root / "config.json").read_text())
    config.pop("talkgate")
    config["talker_config"]["pad_token_id"] = None
    config["talker_config"]["code_predictor_config"]["pad_token_id"] = None
    model = ref.Qwen3TTSForConditionalGeneration(
        ref.Qwen3TTSConfig(**{k: v for k, v in config.items() if k not in ("architectures", "model_type")})).eval()
    missing, unexpected = model.load_state_dict(load_file(str(root / "model.safetensors")), strict=False)
    assert not missing and not unexpected
    wrapper = wrapper_for(model, root)
    tts = load_tts(root)
    audio = voiced(7, 1.5)
    item = wrapper.create_voice_clone_prompt((audio, 24000), ref_text="Hi.")[0]
    vp = make_voice_prompt(tts, audio, 24000, ref_text="Hi.")
    assert np.abs(vp.embedding_array() - item.ref_spk_embedding.numpy()).max() <= TOL
    assert np.array_equal(vp.codes_array(), item.ref_code.numpy())
