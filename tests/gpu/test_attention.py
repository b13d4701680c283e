"""The one-token attention kernel (synth/attention.py) equals the model's PyTorch path: q/k norm and
RoPE (Attention.qkv), the cache write, SDPA over the row's positions. In Triton's interpreter on a
CPU machine (conftest.py), compiled on a GPU."""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from talkgate.synth.config import DecoderDims
from talkgate.synth.model import Attention

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"


@pytest.fixture(scope="module")
def kernel():
    pytest.importorskip("triton", reason="triton is part of the test extra (and of torch on CUDA)")
    return importlib.import_module("talkgate.synth.attention")


def layer(dtype, heads=4, kv_heads=2, D=32) -> Attention:
    dims = DecoderDims(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=heads,
                       num_kv_heads=kv_heads, head_dim=D, rms_norm_eps=1e-6, rope_theta=10000.0)
    g = torch.Generator().manual_seed(0)
    attn = Attention(dims)
    for p in attn.parameters():
        p.data = torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 2 else 1.0) + (1.0 if p.dim() == 1 else 0.0)
    attn.fuse()
    return attn.to(DEVICE, dtype).requires_grad_(False)


def reference(attn, x, cos, sin, kc, vc, slots, pos):
    """The PyTorch path, on copies of the caches: (output before o_proj [B, heads*D], k cache, v cache)."""
    kc, vc = kc.clone(), vc.clone()
    q, k, v = attn.qkv(x[:, None], cos[:, None], sin[:, None])
    kc[slots, :, pos] = k[:, 0]
    vc[slots, :, pos] = v[:, 0]
    L = kc.shape[2]
    mask = (torch.arange(L, device=x.device)[None, :] <= pos[:, None])[:, None, None]
    out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), kc[slots].float(), vc[slots].float(),
                                         attn_mask=mask, enable_gqa=True)
    return out[:, :, 0].reshape(x.shape[0], -1), kc, vc


# bf16: the kernel sums the norm's squares in another order, so a k or q element may round one bf16 step
# (2^-8 relative) the other way; attention of these random layers is peaky enough to turn that into ~2%
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)])
def test_one_token_attention_matches_the_pytorch_path(kernel, dtype, tol):
    attn = layer(dtype)
    torch.manual_seed(1)
    S, L, D = 9, 70, attn.head_dim
    kc = torch.randn(S, attn.n_kv, L, D, device=DEVICE, dtype=dtype)
    vc = torch.randn_like(kc)
    for B in (1, 3, 6):
        slots = torch.randperm(S, device=DEVICE)[:B]
        pos = torch.randint(0, L, (B,), device=DEVICE)
        pos[0] = 0 if B == 3 else pos[0]                            # a row with no cached position
        x = torch.randn(B, 64, device=DEVICE, dtype=dtype)
        angle = pos[:, None].float() * torch.rand(D // 2, device=DEVICE)
        cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
        want, want_k, want_v = reference(attn, x, cos, sin, kc, vc, slots, pos)
        k2, v2 = kc.clone(), vc.clone()
        got = kernel.one_token_attention(F.linear(x, attn.qkv_weight), attn.q_norm.weight, attn.k_norm.weight,
                                         attn.q_norm.eps, cos, sin, k2, v2, slots, pos, attn.n_heads).float()
        assert ((got - want).norm() / want.norm()).item() < tol, B
        # the cache holds the new k/v (rounded like the PyTorch path) and nothing else changed
        step = 1e-5 if dtype == torch.float32 else 2 ** -4      # a few bf16 steps of the largest term
        assert (k2.float() - want_k.float()).abs().max() <= step * want_k.float().abs().max()
        assert torch.equal(v2, want_v)


def test_shared_position_and_row_slots(kernel):
    """The code predictor's form: no slots (row b uses cache row b), one position for every row."""
    attn = layer(torch.float32)
    B, L, D = 3, 16, attn.head_dim
    kc = torch.randn(B, attn.n_kv, L, D, device=DEVICE)
    vc = torch.randn_like(kc)
    x = torch.randn(B, 64, device=DEVICE)
    angle = 5 * torch.rand(D // 2, device=DEVICE)
    cos, sin = torch.cat([angle, angle]).cos(), torch.cat([angle, angle]).sin()
    slots, pos = torch.arange(B, device=DEVICE), torch.full((B,), 5, device=DEVICE)
    want, _, _ = reference(attn, x, cos.expand(B, -1), sin.expand(B, -1), kc, vc, slots, pos)
    got = kernel.one_token_attention(F.linear(x, attn.qkv_weight), attn.q_norm.weight, attn.k_norm.weight,
                                     attn.q_norm.eps, cos, sin, kc, vc, None, 5, attn.n_heads)
    assert ((got - want).norm() / want.norm()).item() < 1e-5


@pytest.mark.parametrize("page", [8, 16])
def test_one_token_attention_through_a_page_table(kernel, page):
    """The Talker's KV in pages (model.Talker.setup_cache): the kernel reads and writes a slot's positions through its
    row of the page table, as it would the contiguous cache its pages make up; the scratch page 0 is not touched."""
    attn = layer(torch.float32)
    torch.manual_seed(2)
    S, slot_pages, D = 4, 5, attn.head_dim
    kp = torch.randn(1 + S * slot_pages, attn.n_kv, page, D, device=DEVICE)
    vp = torch.randn_like(kp)
    table = (1 + torch.randperm(S * slot_pages, device=DEVICE)).view(S, slot_pages)

    def contiguous(pages):                        # [S, kv_heads, slot_pages * page, D]
        return pages[table].transpose(1, 2).reshape(S, attn.n_kv, slot_pages * page, D)

    slots = torch.tensor([2, 0, 3], device=DEVICE)
    pos = torch.tensor([0, 2 * page + 3, slot_pages * page - 1], device=DEVICE)
    x = torch.randn(3, 64, device=DEVICE)
    angle = pos[:, None].float() * torch.rand(D // 2, device=DEVICE)
    cos, sin = torch.cat([angle, angle], -1).cos(), torch.cat([angle, angle], -1).sin()
    want, want_k, want_v = reference(attn, x, cos, sin, contiguous(kp), contiguous(vp), slots, pos)
    scratch = kp[0].clone()
    got = kernel.one_token_attention(F.linear(x, attn.qkv_weight), attn.q_norm.weight, attn.k_norm.weight,
                                     attn.q_norm.eps, cos, sin, kp, vp, slots, pos, attn.n_heads, table)
    assert ((got - want).norm() / want.norm()).item() < 1e-5
    torch.testing.assert_close(contiguous(kp), want_k, atol=1e-5, rtol=1e-5)
    assert torch.equal(contiguous(vp), want_v) and torch.equal(kp[0], scratch)
