"""A code predictor pass's layers with their norms folded (synth/model.py run_layers_folded: the norms' weights in the
projections, each row's 1/rms in the attention kernel and synth/scaled_swiglu.py, the residual adds in addmm) equal
run_layers with the same one-token attention kernel, output and caches. In Triton's interpreter on a CPU machine
(conftest.py), compiled on a GPU."""
from __future__ import annotations

import copy
import importlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from talkgate.synth.config import DecoderDims
from talkgate.synth.model import DecoderLayer, RMSNorm, fold_norms, run_layers, run_layers_folded

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def kernels():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.scaled_swiglu")


def stack(dtype, layers=2, hidden=64, intermediate=96):
    """Random layers whose norms' weights are far from one (so that a weight left out or applied twice shows)."""
    dims = DecoderDims(hidden_size=hidden, intermediate_size=intermediate, num_layers=layers, num_heads=4,
                       num_kv_heads=2, head_dim=32, rms_norm_eps=1e-6, rope_theta=10000.0)
    g = torch.Generator().manual_seed(0)
    decoder = nn.ModuleList(DecoderLayer(dims) for _ in range(layers))
    norm = RMSNorm(hidden, dims.rms_norm_eps)
    for p in [*decoder.parameters(), *norm.parameters()]:
        p.data = torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 2 else 0.5) + (1.0 if p.dim() == 1 else 0.0)
    for layer in decoder:
        layer.self_attn.fuse()
        layer.mlp.fuse()
    return decoder.to(DEVICE, dtype).requires_grad_(False), norm.to(DEVICE, dtype).requires_grad_(False)


def test_scaled_swiglu_is_silu_of_the_normed_projection(kernels):
    """silu(gate * r) * (up * r) with r x's 1/rms, for a row width that is not a power of two and columns past a
    program's block."""
    torch.manual_seed(0)
    B, H, I = 5, 96, kernels.BLOCK + 40
    x = torch.randn(B, H, device=DEVICE) * torch.tensor([[0.01], [0.1], [1.0], [10.0], [100.0]], device=DEVICE)
    gate_up = torch.randn(B, 2 * I, device=DEVICE) * 3
    r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    gate, up = (gate_up * r).chunk(2, dim=-1)
    torch.testing.assert_close(kernels.scaled_swiglu(gate_up, x, 1e-6), F.silu(gate) * up, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_folded_layers_follow_run_layers(kernels, dtype, tol):
    """Four passes at positions 0-3 of one cache each way: every pass's output and the caches it wrote."""
    attention = importlib.import_module("talkgate.synth.attention")
    decoder, norm = stack(dtype)
    folded = copy.deepcopy(decoder)
    fold_norms(folded)
    torch.manual_seed(1)
    B, L = 3, 16
    attn = decoder[0].self_attn
    caches = [[torch.zeros(B, attn.n_kv, L, attn.head_dim, device=DEVICE, dtype=dtype) for _ in range(2)]
              for _ in decoder]
    folded_caches = [[c.clone() for c in pair] for pair in caches]
    for pos in range(4):
        x = torch.randn(B, 64, device=DEVICE, dtype=dtype) * 2
        angle = pos * torch.rand(attn.head_dim // 2, device=DEVICE)
        cos, sin = torch.cat([angle, angle]).cos(), torch.cat([angle, angle]).sin()

        def plain(i, layer, h):               # the attention kernel on the normed rows, as before the folding
            attn = layer.self_attn
            return attn.o_proj(attention.one_token_attention(
                F.linear(h[:, 0], attn.qkv_weight), attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.eps, cos, sin,
                caches[i][0], caches[i][1], None, pos, attn.n_heads))[:, None]

        def folded_out(i, layer, x):
            return layer.self_attn.one_token(x, layer.input_layernorm.eps, cos, sin, folded_caches[i][0],
                                             folded_caches[i][1], None, pos)
        want = run_layers(decoder, norm, x[:, None], plain)[:, 0].float()
        got = run_layers_folded(folded, norm, x, folded_out).float()
        assert ((got - want).norm() / want.norm()).item() < tol, pos
        for (k, v), (fk, fv) in zip(caches, folded_caches):
            for a, b in ((k, fk), (v, fv)):
                assert ((a.float() - b.float()).norm() / a.float().norm()).item() < tol, pos


def test_the_code_predictor_draws_the_same_codes_through_its_folded_passes(kernels, monkeypatch):
    """CodePredictor.predict's later passes through run_layers_folded (CUDA's path; here its kernels in the
    interpreter) against SDPA's per-layer path, float32: the same 15 greedy and seeded codes and embedding sum."""
    from talkgate.synth import model as model_module
    from talkgate.synth.api import SamplingParams
    from talkgate.synth.config import GenerationConfig, PredictorConfig
    from talkgate.synth.model import CodePredictor, fuse_projections
    from talkgate.synth.sampling import FrameSampler, RowSampling
    dims = DecoderDims(hidden_size=32, intermediate_size=96, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                       rms_norm_eps=1e-6, rope_theta=10000.0)
    torch.manual_seed(0)
    predictor = CodePredictor(PredictorConfig(dims=dims, vocab_size=2048, num_code_groups=16), 64)
    for name, p in predictor.named_parameters():
        if "norm" in name:
            p.data = 1.0 + 0.3 * torch.randn(p.shape)
    predictor = predictor.to(DEVICE).eval().requires_grad_(False)
    plain = copy.deepcopy(predictor)
    for model, fold in ((plain, False), (predictor, True)):
        fuse_projections(model, fold=fold)
        model.setup(DEVICE)
    rows = RowSampling.build([SamplingParams(seed=7), SamplingParams(greedy=True), SamplingParams(seed=9)],
                             GenerationConfig.parse({}), DEVICE)
    hidden, code0 = torch.randn(3, 64, device=DEVICE), torch.randn(3, 64, device=DEVICE)

    def draw(model, folded: bool):
        monkeypatch.setattr(model_module, "one_token_kernel", lambda x: folded)
        return model.predict(hidden, code0, FrameSampler(rows, torch.tensor([1 << 33, 5, 6], device=DEVICE)))
    (plain_codes, plain_sum), (codes, embed_sum) = draw(plain, False), draw(predictor, True)
    assert torch.equal(codes, plain_codes)
    torch.testing.assert_close(embed_sum, plain_sum, atol=1e-5, rtol=1e-5)


def test_the_talker_steps_through_its_folded_layers_as_through_its_gathered_path(kernels, tiny_checkpoint, monkeypatch):
    """Talker.forward's one-token step through run_layers_folded (CUDA's path: slots, per-row positions, the KV in
    shuffled pages) against its gathered SDPA path, float32: the final-normed hidden state and the K/V written."""
    from talkgate.synth import model as model_module
    from talkgate.synth.loader import load_tts
    talker = load_tts(str(tiny_checkpoint), device=DEVICE, with_decoder=False).talker
    g = torch.Generator().manual_seed(4)
    for layer in talker.layers:                  # norms far from one
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.mul_((1.0 + 0.3 * torch.randn(norm.weight.shape, generator=g)).to(DEVICE))
    folded = copy.deepcopy(talker)
    fold_norms(folded.layers)
    kv = table = None
    for model in (talker, folded):
        model.setup_cache(5, 40, DEVICE, torch.float32, page_len=8)
        if kv is None:
            kv = torch.randn(model.kv.shape, generator=g).to(DEVICE)
            table = 1 + torch.randperm(model.page_table.numel(), generator=g).view(model.page_table.shape).to(DEVICE)
        model.page_table.copy_(table)
    x = torch.randn(3, 1, talker.hidden_size, generator=g).to(DEVICE)
    slots, pos = torch.tensor([4, 0, 2], device=DEVICE), torch.tensor([0, 39, 17], device=DEVICE)

    def step(model, one_token: bool):
        model.kv.copy_(kv)
        monkeypatch.setattr(model_module, "one_token_kernel", lambda x: one_token)
        return model(x, pos[:, None], slots)[:, 0], model.kv.clone()
    (want, want_kv), (got, got_kv) = step(talker, False), step(folded, True)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_kv, want_kv, atol=1e-5, rtol=1e-5)
    assert not torch.equal(got_kv, kv)


def test_a_talker_with_its_norms_folded_prefills_as_before(tiny_checkpoint):
    """fold_norms works in place (no copies): every other path then runs norms of unit weight before the folded
    projections, and must compute what it did. A prefill (run_layers, SDPA), float32, norms far from one."""
    from talkgate.synth.loader import load_tts
    talker = load_tts(str(tiny_checkpoint), device=DEVICE, with_decoder=False).talker
    g = torch.Generator().manual_seed(5)
    for layer in talker.layers:
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            norm.weight.copy_(1.0 + 0.3 * torch.randn(norm.weight.shape, generator=g))
    folded = copy.deepcopy(talker)
    fold_norms(folded.layers)
    assert all(torch.equal(layer.input_layernorm.weight, torch.ones_like(layer.input_layernorm.weight))
               for layer in folded.layers)
    x = torch.randn(2, 6, talker.hidden_size, generator=g).to(DEVICE)
    pos = torch.arange(6, device=DEVICE)[None].expand(2, 6)
    outs = []
    for model in (talker, folded):
        model.setup_cache(2, 16, DEVICE, torch.float32, page_len=8)
        outs.append(model(x, pos, torch.tensor([0, 1], device=DEVICE), fresh=True))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
