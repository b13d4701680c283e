"""Qwen3-TTS 12 Hz Talker and code predictor for inference, in plain PyTorch (gpt-fast style).

Shapes: B batch rows, T tokens per row, H Talker hidden, S cache slots, L cache length.

Talker (a Qwen3 decoder: RMSNorm eps from config, q/k RMSNorm per head, GQA, SwiGLU MLP,
3-axis interleaved mRoPE):
  talker.setup_cache(num_slots, max_len, device, dtype, pages=None, page_len=None)
      KV in pages: talker.kv [2, layers, pages, kv_heads, page_len, head_dim] and talker.page_table [S, slot_pages]
      int64: slot s's position p lives in page page_table[s, p // page_len] at p % page_len. pages None: every slot
      its own pages (1 + S * slot_pages, the table set here); else the caller owns the table (synth/pages.py, the
      runner). Page 0 is scratch. Call once before forward (and again to resize).
  talker.embed_text(ids [...]) -> [..., H]       text_projection(text_embedding(ids))
  talker.codec_embedding                          nn.Embedding(3072, H): codebook 0 + control ids
  talker(x [B,T,H], pos [B,T] or [3,B,T] long, slots [B] long, fresh=False) -> hidden [B,T,H] (final norm applied)
      writes K/V at (slots[b], pos[b,t]) (through the page table); row b attends to its own slot's positions
      <= pos[b,t].
      fresh=True (a prefill: pos is 0..T-1 in every row): attention within x, the cache only written.
      [B,T] positions mean all three mRoPE axes are equal (always so for TTS).
  talker.codec_head(hidden) -> logits [.., 3072]
  talker.suppressed                               [3072] bool: ids 2048..3071 except eos, never drawn; eos is banned
      where not allowed (the reference bans it for the first 2 frames: min_new_tokens=2).

Code predictor (5-layer Qwen3 decoder, plain RoPE over positions 0..15 of the frame):
  predictor.setup(device)                         RoPE table and pass inputs; call once after loading
                                                  (predict also reads fuse_projections' stacked embeddings).
  predictor.predict(hidden [B,H], code0_embed [B,H], sampler) -> (codes [B,15], embed_sum [B,H])
      input [hidden, code0_embed] (small_to_mtp_projection first when its hidden differs), then 15
      sequential steps; step g feeds codec_embedding[g-1](code g), projected (a row of pass_inputs[g-1]),
      and samples code g+1 with lm_head[g]. embed_sum = code0_embed + the 15 acoustic embeddings: the next
      Talker input minus its text token. Its KV is a per-call scratch buffer [B, kv_heads, 16, head_dim] per
      layer.

One frame (usable by offline synthesis and by the engine, capturable in a CUDA graph):
  sample_codes(talker, predictor, hidden [B,H], sampler, seen [S,3072] bool, allow_eos [B] bool)
      -> (codes [B,16], embed_sum [B,H]); seen: the codebook-0 ids of each slot's context so far, row b's at
      sampler.slots[b], where its codebook-0 id is marked unless it is eos.
  decode_step(talker, predictor, x [B,1,H], pos [B], slots [B], sampler, seen, allow_eos)
      -> (codes [B,16], embed_sum [B,H]): Talker step, then sample_codes.
  x for frame n+1 = embed_sum of frame n + talker.embed_text(next text id) (tts_eos after the
  text, then tts_pad): see synth/prompt.py for the prefill.
Nothing in these calls reads a tensor value on the host.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from talkgate.synth.config import DecoderDims, PredictorConfig, TalkerConfig
from talkgate.synth.sampling import FrameSampler, kernel_module

PAGE_LEN = 64              # Talker positions a KV page holds (a prompt prefix fits one: synth/runner.py PREFIX_POSITIONS)


def page_length(max_len: int) -> int:
    """The page length of a cache of max_len positions a slot: PAGE_LEN, or one power of two that holds a short one."""
    return min(PAGE_LEN, 1 << max(max_len - 1, 1).bit_length())


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def residual(self, x: torch.Tensor, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm): the residual add and the next norm, one kernel when compiled."""
        x = x + delta
        return x, rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # normalize in float32, scale in the input dtype (as the reference does)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def inv_frequencies(head_dim: int, theta: float) -> torch.Tensor:
    """Computed on the CPU in float32, as the reference does at construction time."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


class Attention(nn.Module):
    def __init__(self, d: DecoderDims):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = d.num_heads, d.num_kv_heads, d.head_dim
        self.q_proj = nn.Linear(d.hidden_size, d.num_heads * d.head_dim, bias=False)
        self.k_proj = nn.Linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=False)
        self.v_proj = nn.Linear(d.hidden_size, d.num_kv_heads * d.head_dim, bias=False)
        self.o_proj = nn.Linear(d.num_heads * d.head_dim, d.hidden_size, bias=False)
        self.q_norm = RMSNorm(d.head_dim, d.rms_norm_eps)
        self.k_norm = RMSNorm(d.head_dim, d.rms_norm_eps)

    def fuse(self, into: torch.Tensor | None = None) -> None:
        """One q/k/v projection (one GEMM instead of three: at batch 1 a step is launch-bound), in `into`
        when given (a layer's row of a stack). The q/k/v parameters become views into it, so the state
        dict and the memory stay as loaded; call again after loading other weights."""
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]).detach()
        if into is not None:
            w = into.copy_(w)
        self.register_buffer("qkv_weight", w, persistent=False)
        for proj, part in zip((self.q_proj, self.k_proj, self.v_proj), w.split(self._split)):
            proj.weight = nn.Parameter(part, requires_grad=False)

    @property
    def _split(self) -> list[int]:
        return [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim]

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B,T,H], cos/sin [B,T,head_dim] -> q [B,T,heads,D], k and v [B,T,kv_heads,D] (rotated)."""
        B, T, _ = x.shape
        q, k, v = F.linear(x, self.qkv_weight).split(self._split, dim=-1)
        q = self.q_norm(q.reshape(B, T, self.n_heads, self.head_dim))
        k = self.k_norm(k.reshape(B, T, self.n_kv, self.head_dim))
        v = v.reshape(B, T, self.n_kv, self.head_dim)
        cos, sin = cos[:, :, None].to(q.dtype), sin[:, :, None].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def one_token(self, x: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                  v_cache: torch.Tensor, slots: torch.Tensor | None, pos, table: torch.Tensor | None = None
                  ) -> torch.Tensor:
        """CUDA, one token per row, rows x [B, H] before their norm (its weight folded into q/k/v: fold_norms) -> the
        attention output [B, heads * D] before o_proj. One kernel (synth/attention.py) scales the projection by each
        row's 1/rms (eps the norm's), then q/k norm, RoPE (cos/sin [B,D] or [D]), the cache write at (slots[b] or b,
        pos) and attention over positions <= pos; table: the caches are pages (Talker.setup_cache)."""
        return self._attend_projected(F.linear(x, self.qkv_weight), x, eps, cos, sin, k_cache, v_cache, slots, pos,
                                      table)

    def new_positions(self, x: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, k_cache: torch.Tensor,
                      v_cache: torch.Tensor, start: int) -> torch.Tensor:
        """one_token for positions start..start+T-1 of every row's cache (row b's cache row b), rows x [T * B, H]
        position-major (position start + t's B rows together), cos/sin [T, D] -> [T * B, heads * D]: one projection,
        then one launch a position, in order, so that each position attends to the keys the launches before it wrote.
        The code predictor's passes, its first (two positions) among them (run_layers_folded)."""
        T, B = cos.shape[0], x.shape[0] // cos.shape[0]
        qkv = F.linear(x, self.qkv_weight)
        out = qkv.new_empty(T * B, self.n_heads * self.head_dim)
        for t in range(T):
            rows = slice(t * B, (t + 1) * B)
            self._attend_projected(qkv[rows], x[rows], eps, cos[t], sin[t], k_cache, v_cache, None, start + t,
                                   out=out[rows])
        return out

    def _attend_projected(self, qkv, x, eps, cos, sin, k_cache, v_cache, slots, pos, table=None, out=None):
        return kernel_module("attention").one_token_attention(
            qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin, k_cache, v_cache, slots, pos,
            self.n_heads, table, x=x, x_eps=eps, out=out)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, causal=False) -> torch.Tensor:
        """q [B,T,heads,D], k/v [B,kv_heads,L,D] -> [B,T,H]."""
        B, T = q.shape[:2]
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask, is_causal=causal,
                                             enable_gqa=self.n_heads != self.n_kv)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, d: DecoderDims):
        super().__init__()
        self.gate_proj = nn.Linear(d.hidden_size, d.intermediate_size, bias=False)
        self.up_proj = nn.Linear(d.hidden_size, d.intermediate_size, bias=False)
        self.down_proj = nn.Linear(d.intermediate_size, d.hidden_size, bias=False)

    def fuse(self, into: torch.Tensor | None = None) -> None:
        """One gate/up projection, as Attention.fuse."""
        w = torch.cat([self.gate_proj.weight, self.up_proj.weight]).detach()
        if into is not None:
            w = into.copy_(w)
        self.register_buffer("gate_up_weight", w, persistent=False)
        for proj, part in zip((self.gate_proj, self.up_proj), w.chunk(2)):
            proj.weight = nn.Parameter(part, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = F.linear(x, self.gate_up_weight).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, d: DecoderDims):
        super().__init__()
        self.self_attn = Attention(d)
        self.mlp = MLP(d)
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)


def run_layers(layers: nn.ModuleList, final_norm: RMSNorm, x: torch.Tensor, attention_out) -> torch.Tensor:
    """The decoder-layer loop: attention_out(i, layer, normed x) -> the attention block's output; each
    residual add is fused with the norm that follows it. Returns the final norm of the last residual."""
    h = layers[0].input_layernorm(x)
    for i, layer in enumerate(layers):
        x, h = layer.post_attention_layernorm.residual(x, attention_out(i, layer, h))
        following = layers[i + 1].input_layernorm if i + 1 < len(layers) else final_norm
        x, h = following.residual(x, layer.mlp(h))
    return h


def fold_norms(layers: nn.ModuleList) -> None:
    """Fold each layer's norms into the projections after them, in place: q/k/v's columns times the input norm's
    weight, gate/up's times the post-attention norm's, each norm's weight then one. Every path computes the same
    function after it (a norm of unit weight before the folded projection: prefill, the persistent kernels, the paths
    without Triton), up to the model dtype's rounding of the folded weights; run_layers_folded needs it. No copies:
    1.9 GB of a 1.7B engine's GPU memory stays with the KV pages."""
    for layer in layers:
        for weight, norm in ((layer.self_attn.qkv_weight, layer.input_layernorm),
                             (layer.mlp.gate_up_weight, layer.post_attention_layernorm)):
            weight.mul_(norm.weight)
            norm.weight.fill_(1.0)


def run_layers_folded(layers: nn.ModuleList, final_norm: RMSNorm, x: torch.Tensor, attention_out) -> torch.Tensor:
    """run_layers for one token a row on CUDA, without its norms' kernels: a norm of x is x's 1/rms (a number a row)
    times the norm's weight, so the weight is folded into the projection after it (fold_norms) and the 1/rms
    applied by the kernel that reads that projection (the attention kernel; synth/scaled_swiglu.py), and each residual
    add is the accumulate of the multiply before it (addmm_, in place: an addmm into another tensor copies its input
    there first, a kernel of its own). Two of a layer's eight kernels fewer: at 256 rows each was ~2 us and a launch
    gap, 140 a code predictor frame. attention_out(i, layer, x) -> the attention block's output before o_proj;
    x [B, H], which the layers' residual adds overwrite (a tensor of the caller's own: the code predictor's pass inputs
    are made for the pass, so its passes copy nothing) -> the final norm of the last residual."""
    swiglu = kernel_module("scaled_swiglu").scaled_swiglu
    for i, layer in enumerate(layers):
        x.addmm_(attention_out(i, layer, x), layer.self_attn.o_proj.weight.t())
        x.addmm_(swiglu(F.linear(x, layer.mlp.gate_up_weight), x, layer.post_attention_layernorm.eps),
                 layer.mlp.down_proj.weight.t())
    return final_norm(x)


def uses_persistent(model: nn.Module, rows: int) -> bool:
    """Whether synth/persistent.py's kernels take this step (CUDA callers only)."""
    kernels = kernel_module("persistent")
    return kernels is not None and kernels.supports(model, rows)


def one_token_kernel(x: torch.Tensor) -> bool:
    return x.is_cuda and kernel_module("attention") is not None


@dataclass
class LayerStack:
    """Every decoder layer's weights of one kind in one tensor [layers, ...]: a persistent kernel
    (synth/persistent.py) addresses a layer by its index. The layers' parameters are views of it."""
    qkv: torch.Tensor               # [L, (heads + 2 kv_heads) * head_dim, H]
    o: torch.Tensor                 # [L, H, heads * head_dim]
    gate_up: torch.Tensor           # [L, 2 * I, H]: gate rows, then up rows
    down: torch.Tensor              # [L, H, I]
    input_norm: torch.Tensor        # [L, H]
    post_norm: torch.Tensor         # [L, H]
    q_norm: torch.Tensor            # [L, head_dim]
    k_norm: torch.Tensor            # [L, head_dim]


def stack_parameters(modules, name: str = "weight") -> torch.Tensor:
    """One tensor [len(modules), ...] of the modules' `name` parameters, which become views of it."""
    stacked = torch.stack([getattr(m, name).detach() for m in modules])
    for m, part in zip(modules, stacked):
        setattr(m, name, nn.Parameter(part, requires_grad=False))
    return stacked


def fuse_projections(*models: nn.Module, fold: bool | None = None) -> None:
    """Fuse q/k/v and gate/up of every decoder layer and stack the layers (model.stacked, a LayerStack), and on CUDA
    fold the norms into them (fold_norms): the loader calls this after loading. fold: by default on CUDA, whose
    one-token steps need it (run_layers_folded), so the model's device when this runs decides; the CPU path keeps the
    checkpoint's values, exact against the reference. The state dict's names and shapes stay as loaded."""
    for model in models:
        layers = model.layers
        first = layers[0]
        qkv = first.self_attn.q_proj.weight.new_empty(len(layers), sum(first.self_attn._split),
                                                      first.self_attn.q_proj.in_features)
        gate_up = first.mlp.gate_proj.weight.new_empty(len(layers), 2 * first.mlp.gate_proj.out_features,
                                                       first.mlp.gate_proj.in_features)
        for i, layer in enumerate(layers):
            layer.self_attn.fuse(qkv[i])
            layer.mlp.fuse(gate_up[i])
        model.stacked = LayerStack(
            qkv=qkv, gate_up=gate_up, o=stack_parameters([l.self_attn.o_proj for l in layers]),
            down=stack_parameters([l.mlp.down_proj for l in layers]),
            input_norm=stack_parameters([l.input_layernorm for l in layers]),
            post_norm=stack_parameters([l.post_attention_layernorm for l in layers]),
            q_norm=stack_parameters([l.self_attn.q_norm for l in layers]),
            k_norm=stack_parameters([l.self_attn.k_norm for l in layers]))
        if (qkv.is_cuda if fold is None else fold):
            fold_norms(layers)
        if isinstance(model, CodePredictor):
            model.heads = stack_parameters(model.lm_head)                 # [15, vocab, H]
            model.embeddings = stack_parameters(model.codec_embedding)    # [15, vocab, Talker H]


class TextProjection(nn.Module):
    """text_hidden -> text_hidden -> Talker hidden, SiLU, with biases (the reference's ResizeMLP)."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class Talker(nn.Module):
    def __init__(self, cfg: TalkerConfig):
        super().__init__()
        d = cfg.dims
        self.cfg = cfg
        self.layers = nn.ModuleList(DecoderLayer(d) for _ in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, d.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)
        self.text_projection = TextProjection(cfg.text_hidden_size, d.hidden_size)
        self.codec_head = nn.Linear(d.hidden_size, cfg.vocab_size, bias=False)
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []

    @property
    def hidden_size(self) -> int:
        return self.cfg.dims.hidden_size

    def setup_cache(self, num_slots: int, max_len: int, device, dtype, pages: int | None = None,
                    page_len: int | None = None) -> None:
        d, cfg = self.cfg.dims, self.cfg
        self.page_len = page_len or page_length(max_len)
        slot_pages = -(-max_len // self.page_len)
        if pages is None:                    # every slot its own pages, after the scratch page
            pages = 1 + num_slots * slot_pages
            table = 1 + torch.arange(num_slots * slot_pages).view(num_slots, slot_pages)
        else:
            table = torch.zeros(num_slots, slot_pages, dtype=torch.long)
        # one tensor [2, layers, pages, kv_heads, page_len, head_dim] (the persistent kernel indexes a layer);
        # per-layer views
        self.kv = torch.zeros(2, len(self.layers), pages, d.num_kv_heads, self.page_len, d.head_dim, device=device,
                              dtype=dtype)
        self.k_cache, self.v_cache = list(self.kv[0]), list(self.kv[1])
        self.page_table = table.to(device)
        self.max_len = max_len
        self.inv_freq = inv_frequencies(d.head_dim, d.rope_theta).to(device)
        self.mrope_axis = mrope_axes(cfg.mrope_section, cfg.mrope_interleaved).to(device)
        # cos/sin of every position a slot's pages hold, once here: Talker.rope gathers a step's rows from them
        self.cos_table, self.sin_table = self._rotation(torch.arange(slot_pages * self.page_len, device=device)
                                                        .float()[:, None] * self.inv_freq)
        suppressed = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        suppressed[cfg.vocab_size - 1024:] = True
        suppressed[cfg.codec_eos] = False
        self.suppressed = suppressed.to(device)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.text_embedding(ids))

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos [B,T] (three equal axes) or [3,B,T] -> cos, sin [B,T,head_dim] float32. [B,T]: the tables' rows (two
        gathers, where computing them took five kernels a step)."""
        if pos.dim() == 2:
            return F.embedding(pos, self.cos_table), F.embedding(pos, self.sin_table)
        # each frequency j rotates with the position of its mRoPE axis
        per_axis = pos.float()[..., None] * self.inv_freq                      # [3,B,T,D/2]
        index = self.mrope_axis.view(1, 1, 1, -1).expand(1, *per_axis.shape[1:])
        return self._rotation(per_axis.gather(0, index)[0])

    @staticmethod
    def _rotation(angle: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        angle = torch.cat((angle, angle), dim=-1)
        return angle.cos(), angle.sin()

    def forward(self, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor, fresh: bool = False) -> torch.Tensor:
        """fresh: x holds positions 0..T-1 of new contexts, so attention runs within x (causal) and the
        cache is only written, not read (a prefill's first audio waits on it)."""
        pos_t = pos if pos.dim() == 2 else pos[0]                               # temporal axis: the cache index
        cos, sin = self.rope(pos)
        if fresh:
            page, at = self._written_at(slots, pos_t)

            def attention_out(i, layer, h):
                attn = layer.self_attn
                q, k, v = attn.qkv(h, cos, sin)
                self.k_cache[i][page, :, at] = k
                self.v_cache[i][page, :, at] = v
                return attn.attend(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
            return run_layers(self.layers, self.norm, x, attention_out)
        if x.shape[1] == 1 and x.is_cuda and uses_persistent(self, x.shape[0]):
            # one launch for the whole step (synth/persistent.py)
            return kernel_module("persistent").talker_step(self, x[:, 0], cos[:, 0], sin[:, 0], slots, pos_t[:, 0])[:, None]
        if x.shape[1] == 1 and one_token_kernel(x):
            # one token per row on CUDA: reads only each row's live cache positions
            def attention_out(i, layer, x):
                return layer.self_attn.one_token(x, layer.input_layernorm.eps, cos[:, 0], sin[:, 0],
                                                 self.k_cache[i], self.v_cache[i], slots, pos_t[:, 0], self.page_table)
            # the layers add to their input in place, and x is the caller's: a copy
            return run_layers_folded(self.layers, self.norm, x[:, 0].clone(), attention_out)[:, None]
        page, at = self._written_at(slots, pos_t)
        L = self.max_len
        positions = torch.arange(L, device=x.device)
        table = self.page_table[slots]                                                        # [B, slot pages]
        mask = (positions[None, None, :] <= pos_t[:, :, None])[:, None]                      # [B,1,T,L]
        # a slot's positions past its context's are in pages it does not hold (scratch, or another context's, or what a
        # context before it left): the mask keeps them out of the softmax but not out of its arithmetic (0 x NaN is
        # NaN), so they are read as zeros (in the gathered copy)
        stale = (positions[None, :] > pos_t.amax(dim=1, keepdim=True))[:, None, :, None]      # [B,1,L,1]

        def gathered(cache):
            """The rows' slots' positions [B, kv_heads, L, D], gathered from their pages."""
            pages = cache[table]
            B, P, kvh, n, D = pages.shape
            return pages.transpose(1, 2).reshape(B, kvh, P * n, D)[:, :, :L].masked_fill_(stale, 0)

        def attention_out(i, layer, h):
            attn, kc, vc = layer.self_attn, self.k_cache[i], self.v_cache[i]
            q, k, v = attn.qkv(h, cos, sin)
            kc[page, :, at] = k
            vc[page, :, at] = v
            return attn.attend(q, gathered(kc), gathered(vc), mask=mask)
        return run_layers(self.layers, self.norm, x, attention_out)

    def _written_at(self, slots: torch.Tensor, pos_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Where each (row, token) writes in the cache: its page and the position within it (the one-token paths'
        kernels find them themselves)."""
        return self.page_table[slots[:, None], pos_t // self.page_len], pos_t % self.page_len


def mrope_axes(section: tuple[int, ...], interleaved: bool) -> torch.Tensor:
    """[head_dim/2] int64: the position axis (0 temporal, 1 height, 2 width) of each frequency.

    Interleaved (Qwen3-TTS): frequency j takes axis i when j % 3 == i and j < 3 * section[i] for
    i in 1, 2; every other frequency takes axis 0. Non-interleaved: consecutive blocks of section[i]."""
    n = sum(section)
    axis = torch.zeros(n, dtype=torch.int64)
    if interleaved:
        for i in range(1, len(section)):
            axis[i:section[i] * len(section):len(section)] = i
    else:
        start = 0
        for i, width in enumerate(section):
            axis[start:start + width] = i % 3
            start += width
    return axis


class CodePredictor(nn.Module):
    def __init__(self, cfg: PredictorConfig, talker_hidden: int):
        super().__init__()
        d = cfg.dims
        self.cfg = cfg
        self.groups = cfg.num_code_groups
        self.layers = nn.ModuleList(DecoderLayer(d) for _ in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        # embeddings live in the Talker's hidden size; the projection maps them to the predictor's
        self.codec_embedding = nn.ModuleList(nn.Embedding(cfg.vocab_size, talker_hidden)
                                             for _ in range(self.groups - 1))
        self.lm_head = nn.ModuleList(nn.Linear(d.hidden_size, cfg.vocab_size, bias=False)
                                     for _ in range(self.groups - 1))
        self.small_to_mtp_projection = (nn.Linear(talker_hidden, d.hidden_size, bias=True)
                                        if talker_hidden != d.hidden_size else None)

    def setup(self, device) -> None:
        d = self.cfg.dims
        angle = torch.arange(self.groups, dtype=torch.float32)[:, None] * inv_frequencies(d.head_dim, d.rope_theta)
        angle = torch.cat((angle, angle), dim=-1)
        self.cos, self.sin = angle.cos().to(device), angle.sin().to(device)
        # a pass's input is a row of a codebook's embedding projected: each table projected once here makes it a
        # lookup, not a multiply of every row each pass (the projection is linear; without one, the tables as they are)
        with torch.no_grad():
            self.pass_inputs = [self._project(e.weight) for e in self.codec_embedding[:-1]]
        # codebook g's code c is row (g - 1) * vocab + c of the stacked embeddings (fuse_projections): one gather of
        # all 15 after the passes, for the sum
        self.code_offsets = torch.arange(self.groups - 1, device=device) * self.cfg.vocab_size

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        return self.small_to_mtp_projection(x) if self.small_to_mtp_projection is not None else x

    def _forward(self, x: torch.Tensor, start: int, kv: list) -> torch.Tensor:
        """x [T,B,Hp] (position-major) at frame positions start..start+T-1 -> the last position's normed hidden
        [B,Hp]. On CUDA the layers run with their norms folded (run_layers_folded), adding to x in place: a pass's
        input is made for it."""
        T, B, _ = x.shape
        if one_token_kernel(x):
            def attention_out(i, layer, x):
                return layer.self_attn.new_positions(x, layer.input_layernorm.eps, self.cos[start:start + T],
                                                     self.sin[start:start + T], kv[i][0], kv[i][1], start)
            return run_layers_folded(self.layers, self.norm, x.reshape(T * B, -1), attention_out)[(T - 1) * B:]
        x = x.transpose(0, 1)
        cos = self.cos[start:start + T][None].expand(B, T, -1)
        sin = self.sin[start:start + T][None].expand(B, T, -1)

        def attention_out(i, layer, h):
            attn, (kc, vc) = layer.self_attn, kv[i]
            q, k, v = attn.qkv(h, cos, sin)
            kc[:, :, start:start + T] = k.transpose(1, 2)
            vc[:, :, start:start + T] = v.transpose(1, 2)
            if start == 0:                  # the first pass: its positions are all there is
                return attn.attend(q, k.transpose(1, 2), v.transpose(1, 2), causal=True)
            return attn.attend(q, kc[:, :, :start + T], vc[:, :, :start + T])       # a later pass: one position
        return run_layers(self.layers, self.norm, x, attention_out)[:, -1]

    def predict(self, hidden: torch.Tensor, code0_embed: torch.Tensor, sampler: FrameSampler,
                return_logits: bool = False):
        """-> codes [B,15] int64, embed_sum [B,H] (and logits [B,15,V] float32 with return_logits).
        Small batches on CUDA run as one persistent kernel (synth/persistent.py)."""
        if hidden.is_cuda and not return_logits and uses_persistent(self, hidden.shape[0]):
            return kernel_module("persistent").predict(self, hidden, code0_embed, sampler.p, sampler.counter,
                                                       sampler.slots)
        B = hidden.shape[0]
        d = self.cfg.dims
        kv = [(hidden.new_empty(B, d.num_kv_heads, self.groups, d.head_dim),
               hidden.new_empty(B, d.num_kv_heads, self.groups, d.head_dim)) for _ in self.layers]
        h = self._forward(self._project(torch.stack([hidden, code0_embed])), 0, kv)
        codes, all_logits = [], []
        for g in range(1, self.groups):
            logits = self.lm_head[g - 1](h)         # model dtype: the sampler widens it where it reads it
            code = sampler.acoustic(logits, g)
            codes.append(code)
            all_logits.append(logits)
            if g < self.groups - 1:
                h = self._forward(F.embedding(code, self.pass_inputs[g - 1])[None], g + 1, kv)
        codes = torch.stack(codes, dim=1)
        embeds = self.embeddings.flatten(0, 1)[codes + self.code_offsets]                  # [B, 15, H]
        embed_sum = torch.cat([code0_embed[:, None], embeds], dim=1).sum(1)
        if return_logits:
            return codes, embed_sum, torch.stack(all_logits, dim=1).float()
        return codes, embed_sum


def sample_codes(talker: Talker, predictor: CodePredictor, hidden: torch.Tensor, sampler: FrameSampler,
                 seen: torch.Tensor, allow_eos: torch.Tensor, return_logits: bool = False):
    """Codebook 0 from the Talker's last hidden state, then codebooks 1..15: codes [B,16], embed_sum [B,H]
    (with return_logits also the Talker logits [B,3072] and predictor logits [B,15,2048], float32)."""
    logits = talker.codec_head(hidden)             # model dtype: the sampler widens it where it reads it
    code0 = sampler.codebook0(logits, seen, talker.suppressed, talker.cfg.codec_eos, allow_eos)
    out = predictor.predict(hidden, talker.codec_embedding(code0), sampler, return_logits)
    codes = torch.cat([code0[:, None], out[0]], dim=1)
    if return_logits:
        return codes, out[1], logits.float(), out[2]
    return codes, out[1]


def decode_step(talker: Talker, predictor: CodePredictor, x: torch.Tensor, pos: torch.Tensor, slots: torch.Tensor,
                sampler: FrameSampler, seen: torch.Tensor, allow_eos: torch.Tensor):
    """Talker step for x [B,1,H] at pos [B] in slots [B], then sample_codes: (codes [B,16], embed_sum [B,H])."""
    hidden = talker(x, pos[:, None], slots)[:, 0]
    return sample_codes(talker, predictor, hidden, sampler, seen, allow_eos)
