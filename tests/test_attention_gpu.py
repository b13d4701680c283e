"""The Triton decode attention equals the SDPA path over gathered caches (CUDA only)."""
import pytest
import torch
import torch.nn.functional as F

from talkgate.synth import attention

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (not on this machine)")


@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_decode_attention_matches_sdpa(dtype, tol):
    torch.manual_seed(0)
    slots, heads, kv_heads, L, D = 33, 16, 8, 300, 128
    kc = torch.randn(slots, kv_heads, L, D, device="cuda", dtype=dtype)
    vc = torch.randn_like(kc)
    for B in (1, 5, 32):
        rows = torch.randperm(slots, device="cuda")[:B]
        lens = torch.randint(1, L + 1, (B,), device="cuda")
        q = torch.randn(B, heads, D, device="cuda", dtype=dtype)
        mask = (torch.arange(L, device="cuda")[None, :] < lens[:, None])[:, None, None]
        ref = F.scaled_dot_product_attention(q[:, :, None].float(), kc[rows].float(), vc[rows].float(),
                                             attn_mask=mask, enable_gqa=True)[:, :, 0]
        got = attention.decode_attention(q, kc, vc, rows, lens).float()
        assert ((got - ref).norm() / ref.norm()).item() < tol, B
