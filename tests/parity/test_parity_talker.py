"""Talker + code predictor parity with the official reference (qwen_tts), fp32 on the CPU, tiny sizes.

The reference model is built from a tiny config, seeded, written with its own save_pretrained, and
loaded by talkgate's loader. Greedy decoding must give the reference generate's codes, all 16
codebooks, and the Talker / code-predictor logits must match at every step. Random weights never
sample eos, so both sides run a fixed number of frames: the reference gets an eos_token_id inside the
suppressed range (3071), talkgate ignore_eos=True (same semantics: codec eos 2150 stays allowed).
"""
from __future__ import annotations

import shutil

import pytest
import torch

from talkgate.synth.api import SamplingParams
from talkgate.synth.loader import load_tts
from talkgate.synth.offline import generate_codes
from tests.reference import ref, save_reference, tiny_config

FRAMES = 32
TOL = 1e-4
TEXT = "Hello world! Talkgate streams speech, 12.5 frames a second; 你好，世界。"
NEVER_EOS = 3071


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny matrices gain nothing from threads, and on a busy 2-core machine OpenMP waits make
    every op several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(tmp_path, tiny_checkpoint, seed: int, variant: str, prepare=None, **config_kw):
    torch.manual_seed(seed)
    model = ref.Qwen3TTSForConditionalGeneration(tiny_config(variant, **config_kw)).eval()
    with torch.no_grad():
        # the reference initializes norm weights to 1 and biases to 0: make every one distinct, so
        # that a swapped or missing norm / bias tensor shows
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
        if prepare is not None:
            prepare(model)
    save_reference(model, tmp_path)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copyfile(tiny_checkpoint / name, tmp_path / name)
    shutil.copytree(tiny_checkpoint / "speech_tokenizer", tmp_path / "speech_tokenizer")
    return model, load_tts(tmp_path)


def reference_run(model, tts, text, voice, language, instructions, frames, repetition_penalty=1.05):
    """Reference greedy generate: codes [frames, 16] and raw logits per frame, caught by hooks. Its input
    ids are its own: the template strings through transformers' tokenizer, as its processor does."""
    from transformers import AutoTokenizer
    device = model.talker.codec_head.weight.device
    tokenizer = AutoTokenizer.from_pretrained(str(tts.path))
    ids = torch.tensor([tokenizer(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]],
                       device=device)
    instruct = None
    if instructions:
        instruct = [torch.tensor([tokenizer(f"<|im_start|>user\n{instructions}<|im_end|>\n")["input_ids"]],
                                 device=device)]
    talker_logits, predictor_logits = [], [[] for _ in range(15)]
    hooks = [model.talker.codec_head.register_forward_hook(lambda m, i, o: talker_logits.append(o[0, -1].clone()))]
    for g, head in enumerate(model.talker.code_predictor.lm_head):
        hooks.append(head.register_forward_hook(lambda m, i, o, g=g: predictor_logits[g].append(o[0, -1].clone())))
    try:
        codes, _ = model.generate(input_ids=[ids], instruct_ids=instruct, languages=[language],
                                  speakers=[voice] if voice else None, max_new_tokens=frames + 1,
                                  eos_token_id=NEVER_EOS, do_sample=False, subtalker_dosample=False,
                                  repetition_penalty=repetition_penalty)
    finally:
        for h in hooks:
            h.remove()
    per_frame = [(talker_logits[n].float().cpu(), torch.stack([predictor_logits[g][n] for g in range(15)]).float().cpu())
                 for n in range(frames)]
    return codes[0].cpu(), per_frame


def check(model, tts, voice, language, instructions=None, text=TEXT):
    ref_codes, ref_logits = reference_run(model, tts, text, voice, language, instructions, FRAMES)
    logits = []
    codes = generate_codes(tts, text, voice=voice, language=language, instructions=instructions,
                           sampling=SamplingParams(greedy=True), max_frames=FRAMES, ignore_eos=True, logits=logits)
    assert ref_codes.shape == (FRAMES, 16)
    for n in range(FRAMES):
        assert (logits[n][0] - ref_logits[n][0]).abs().max() <= TOL, f"Talker logits differ at frame {n}"
        assert (logits[n][1] - ref_logits[n][1]).abs().max() <= TOL, f"code predictor logits differ at frame {n}"
    assert torch.equal(codes, ref_codes), f"codes differ from frame {int((codes != ref_codes).any(1).nonzero()[0])}"
    return codes


@pytest.fixture(scope="module")
def custom_voice(tmp_path_factory, tiny_checkpoint):
    return build(tmp_path_factory.mktemp("ref_cv"), tiny_checkpoint, 0, "custom_voice")


@pytest.mark.parametrize("voice,language", [("ryan", "english"), ("Vivian", "auto"), ("eric", "chinese"),
                                            ("dylan", "auto"), ("eric", "english")])
def test_custom_voice_greedy_matches_reference(custom_voice, voice, language):
    model, tts = custom_voice
    check(model, tts, voice, language)


def favour_a_few_codes(model):
    """Random weights rarely repeat a greedy code; make codes 100..103 win most frames so that the
    repetition penalty decides between them: a large constant in one hidden dimension (through the
    text projection's bias, added at every position) read by those four codec_head rows."""
    t = model.talker
    t.text_projection.linear_fc2.bias[5] = 4.0
    t.model.norm.weight[5] = 20.0
    t.codec_head.weight[100:104, 5] = torch.tensor([0.30, 0.298, 0.296, 0.294])


def test_repetition_penalty_matches_reference(tmp_path, tiny_checkpoint):
    model, tts = build(tmp_path, tiny_checkpoint, 4, "custom_voice", prepare=favour_a_few_codes)
    codes = check(model, tts, "ryan", "english")
    assert codes[:, 0].unique().numel() < FRAMES // 2, "the penalty is not exercised: codes do not repeat"
    plain = generate_codes(tts, TEXT, voice="ryan", language="english", max_frames=FRAMES, ignore_eos=True,
                           sampling=SamplingParams(greedy=True, repetition_penalty=1.0))
    assert not torch.equal(plain[:, 0], codes[:, 0])


def test_voice_design_with_instructions_matches_reference(tmp_path, tiny_checkpoint):
    model, tts = build(tmp_path, tiny_checkpoint, 1, "voice_design")
    check(model, tts, None, "english", instructions="A warm, low female voice, speaking slowly.")


def test_custom_voice_1b7_instructions_and_shared_hidden(tmp_path, tiny_checkpoint):
    """1.7B CustomVoice takes instructions; predictor hidden == Talker hidden: no small_to_mtp_projection."""
    model, tts = build(tmp_path, tiny_checkpoint, 2, "custom_voice", model_size="1b7",
                       separate_predictor_hidden=False)
    assert tts.code_predictor.small_to_mtp_projection is None
    check(model, tts, "serena", "auto", instructions="Speak with excitement.")


def test_mrope_with_distinct_axes_matches_reference(custom_voice):
    """TTS always uses three equal position axes; check the interleaved section mapping with distinct ones."""
    model, tts = custom_voice
    T, H = 9, tts.talker.hidden_size
    torch.manual_seed(3)
    x = torch.randn(1, T, H)
    pos = torch.stack([torch.arange(T), torch.randint(0, 50, (T,)), torch.randint(0, 50, (T,))])[:, None]   # [3,1,T]
    with torch.no_grad():
        want = model.talker.model(inputs_embeds=x, position_ids=pos, use_cache=False).last_hidden_state
        tts.talker.setup_cache(2, 16, "cpu", torch.float32)
        got = tts.talker(x, pos, torch.tensor([1]))
        equal_axes = tts.talker(x, pos[0], torch.tensor([0]))
    assert (got - want).abs().max() <= TOL
    assert (equal_axes - want).abs().max() > 1e-3


# ----- sampling: the reference's logits processors (transformers) vs synth.sampling -----

def hf_processed(logits, temperature, top_k, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    x = TemperatureLogitsWarper(temperature)(None, logits.clone())
    x = TopKLogitsWarper(top_k)(None, x)
    return TopPLogitsWarper(top_p)(None, x)


def test_repetition_penalty_equals_transformers():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor
    from talkgate.synth.sampling import apply_repetition_penalty
    torch.manual_seed(0)
    logits = torch.randn(3, 50)
    history = torch.tensor([[1, 7, 7, 30], [0, 0, 0, 0], [49, 2, 3, 4]])
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter_(1, history, True)
    want = RepetitionPenaltyLogitsProcessor(1.3)(history, logits.clone())
    assert torch.equal(apply_repetition_penalty(logits, seen, torch.full((3,), 1.3)), want)


def test_sampling_draws_from_the_processed_distribution():
    from talkgate.synth.sampling import sample
    logits = torch.tensor([[2.0, 1.5, 1.4, 0.3, 0.2, -1.0, -3.0, 0.9]])
    N = 40000
    for temperature, top_k, top_p in [(0.9, 50, 1.0), (0.7, 4, 1.0), (1.3, 8, 0.8), (1.0, 0, 0.5)]:
        want = hf_processed(logits, temperature, top_k or 8, top_p).softmax(-1)[0]
        ids = sample(logits.expand(N, -1), torch.full((N,), temperature), torch.full((N,), top_k),
                     torch.full((N,), top_p), torch.zeros(N, dtype=torch.bool), torch.full((N,), 1234),
                     torch.arange(N), 0)
        got = torch.bincount(ids, minlength=8).float() / N
        assert (got - want).abs().max() < 0.015, (temperature, top_k, top_p, got, want)
        assert (got[want == 0] == 0).all()


def test_sampling_support_matches_transformers_at_codec_vocab():
    from talkgate.synth.sampling import sample
    torch.manual_seed(1)
    logits = torch.randn(1, 3072) * 3
    N = 3000
    for top_k, top_p in [(50, 1.0), (5, 1.0), (50, 0.3)]:
        allowed = torch.isfinite(hf_processed(logits, 0.9, top_k, top_p))[0]
        ids = sample(logits.expand(N, -1), torch.full((N,), 0.9), torch.full((N,), top_k), torch.full((N,), top_p),
                     torch.zeros(N, dtype=torch.bool), torch.full((N,), 7), torch.arange(N), 3)
        assert allowed[ids].all()
        if top_k == 5:
            assert set(ids.tolist()) == set(allowed.nonzero()[:, 0].tolist())


def test_sampling_is_per_row_deterministic_and_greedy_rows_take_argmax():
    from talkgate.synth.sampling import sample
    torch.manual_seed(2)
    logits = torch.randn(4, 2048)
    args = dict(temperature=torch.full((4,), 1.0), top_k=torch.full((4,), 50), top_p=torch.ones(4))
    seed, counter = torch.tensor([5, 6, 5, 9]), torch.tensor([3, 3, 3, 0])
    a = sample(logits, **args, greedy=torch.tensor([False, False, False, True]), seed=seed, counter=counter, stream=2)
    # row 2 alone, in another batch position: the same id as in the batch
    b = sample(logits[[2, 0]], **{k: v[:2] for k, v in args.items()}, greedy=torch.zeros(2, dtype=torch.bool),
               seed=seed[[2, 0]], counter=counter[[2, 0]], stream=2)
    assert a[2] == b[0] and a[0] == b[1]
    assert a[3] == logits[3].argmax()
    other = sample(logits, **args, greedy=torch.zeros(4, dtype=torch.bool), seed=seed, counter=counter + 1, stream=2)
    assert not torch.equal(a[:3], other[:3])


def test_batched_slots_equal_single_runs(custom_voice):
    """Two contexts of different prompt lengths in slots 3 and 1, stepped together with per-row
    positions: each row's codes equal its own single-context run (slot-indexed KV, per-row masks,
    per-row sampling with seeds)."""
    from talkgate.synth.api import ContextParams
    from talkgate.synth.model import sample_codes
    from talkgate.synth.sampling import FrameSampler, RowSampling
    _, tts = custom_voice
    talker, cfg, frames = tts.talker, tts.config, 12
    jobs = [dict(text=TEXT, voice="ryan", language="english", sampling=SamplingParams(seed=11)),
            dict(text="Short one.", voice="eric", language="auto", sampling=SamplingParams(greedy=True))]
    alone = [generate_codes(tts, max_frames=frames, ignore_eos=True, **job) for job in jobs]

    slots = torch.tensor([3, 1])
    talker.setup_cache(4, 128, "cpu", torch.float32)
    hidden, prompt_len, following = [], [], []
    for job, slot in zip(jobs, slots):
        prompt = tts.prompts.resolve(ContextParams(voice=job["voice"], language=job["language"]))
        role, ids = tts.prompts.tokenize_text(job["text"])
        x = tts.prompts.prefill(prompt, ids[:1], role)
        hidden.append(talker(x[None], torch.arange(len(x))[None], slot[None])[0, -1])
        prompt_len.append(len(x))
        following.append(ids[1:] + [cfg.tts_eos])
    hidden = torch.stack(hidden)
    rows = RowSampling.build([job["sampling"] for job in jobs], tts.generation_config)
    seen = torch.zeros(2, cfg.talker.vocab_size, dtype=torch.bool)
    got = []
    with torch.inference_mode():
        for n in range(frames):
            codes, embed_sum = sample_codes(talker, tts.code_predictor, hidden, FrameSampler(rows, torch.tensor([n, n])),
                                            seen, torch.ones(2, dtype=torch.bool))
            seen[torch.arange(2), codes[:, 0]] = True
            got.append(codes)
            text = torch.tensor([f[n] if n < len(f) else cfg.tts_pad for f in following])
            pos = torch.tensor([p + n for p in prompt_len])
            hidden = talker(embed_sum[:, None] + talker.embed_text(text)[:, None], pos[:, None], slots)[:, 0]
    got = torch.stack(got, 1)
    assert torch.equal(got[0], alone[0]) and torch.equal(got[1], alone[1])
