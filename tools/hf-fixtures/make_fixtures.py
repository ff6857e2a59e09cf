#!/usr/bin/env python3
"""Reference fixtures for kiln: tiny random-weight Hugging Face models.

For every variant this script
  * builds a small Llama / Qwen2 / Mistral model with transformers (seeded),
  * overwrites all parameters with seeded noise (weights ~N(0, 0.08^2), RMSNorm
    weights ~1 + N(0, 0.2^2), biases ~N(0, 0.1^2)) so norms and biases matter,
  * saves it with save_pretrained (config.json + safetensors, nothing else),
  * reloads the saved directory with from_pretrained(dtype=float32,
    attn_implementation="eager") -- so the reference is computed from exactly
    what is on disk (bf16/f16 weights are upcast: "low-precision weights, f32
    math") --
  * records the logits of one forward pass over a fixed prompt (logits.bin,
    raw little-endian float32, shape [T, V]), the greedy continuation of
    model.generate (16 new tokens, no logits processors, EOS disabled), and
    expected.json with the ids, versions, effective config and self-checks:
      - an independent plain-torch re-implementation of the forward pass
        (manual_max_abs_diff),
      - a no-KV-cache greedy loop compared with generate (greedy_ids_nocache,
        decode_logits.bin = its per-step last-position logits [16, V]),
      - the RoPE inverse frequencies HF uses vs. an independent formula,
      - for mistral-swa: the sliding-window boundary (probed empirically).

Everything runs on the CPU in float32 with deterministic algorithms.
Usage: python3 make_fixtures.py --out DIR [--only name,name]
"""

import argparse
import json
import math
import os
import shutil
import sys
import traceback

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig  # noqa: E402

torch.set_default_dtype(torch.float32)
torch.use_deterministic_algorithms(True)
torch.set_num_threads(4)

NEW_TOKENS = 16
W_STD = 0.08      # linear layers
EMB_STD = 0.3     # untied input embedding
TIED_STD = 0.1    # tied embedding == lm_head (small: limits self-repetition in greedy)
HEAD_STD = 0.15   # untied lm_head
NORM_NOISE = 0.2
BIAS_STD = 0.1

LOG = []


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    LOG.append(s)


# --------------------------------------------------------------------------
# variants
# --------------------------------------------------------------------------

def base(**kw):
    d = dict(vocab_size=320, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
             hidden_act="silu", bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
             initializer_range=0.05)
    d.update(kw)
    return d


def rope(theta, rope_type="default", **kw):
    r = {"rope_type": rope_type, "rope_theta": float(theta)}
    r.update(kw)
    return r


VARIANTS = [
    dict(name="llama-gqa", arch="llama", seed=101, T=24, legacy=True,
         cfg=base(rms_norm_eps=1e-5), rope=rope(10000.0)),
    dict(name="llama-mqa", arch="llama", seed=102, T=28, legacy=False,
         cfg=base(num_key_value_heads=1, tie_word_embeddings=True, rms_norm_eps=1e-6),
         rope=rope(1000000.0)),
    dict(name="llama-mha-tied", arch="llama", seed=103, T=20, legacy=False,
         cfg=base(num_key_value_heads=4, tie_word_embeddings=True, rms_norm_eps=1e-5),
         rope=rope(500000.0)),
    # head_dim 16, theta 5e5: wavelengths 6.3, 32.4, 167, ... With original_max 64,
    # low_freq_factor 1, high_freq_factor 4 the bands are <16 (kept), 16..64
    # (smoothed), >64 (divided by 8): all three llama3 regimes are exercised.
    dict(name="llama3-rope", arch="llama", seed=104, T=40, legacy=True,
         cfg=base(rms_norm_eps=1e-5, max_position_embeddings=512),
         rope=rope(500000.0, "llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=64)),
    dict(name="llama-linear-rope", arch="llama", seed=105, T=30, legacy=False,
         cfg=base(rms_norm_eps=1e-6), rope=rope(10000.0, "linear", factor=2.0)),
    dict(name="qwen2-bias", arch="qwen2", seed=106, T=26, legacy=True,
         cfg=base(rms_norm_eps=1e-6, use_sliding_window=False), rope=rope(1000000.0)),
    dict(name="mistral-swa", arch="mistral", seed=107, T=32, legacy=True,
         cfg=base(rms_norm_eps=1e-5, sliding_window=8), rope=rope(1000000.0)),
    dict(name="llama-bf16", arch="llama", seed=108, T=24, legacy=True, save_dtype="bfloat16",
         cfg=base(rms_norm_eps=1e-5), rope=rope(500000.0)),
    dict(name="llama-odd", arch="llama", seed=109, T=37, legacy=True,
         cfg=base(hidden_size=96, num_attention_heads=6, num_key_value_heads=3, intermediate_size=200,
                  vocab_size=301, num_hidden_layers=3, rms_norm_eps=1e-6),
         rope=rope(10000.0)),
    dict(name="llama-sharded", arch="llama", seed=110, T=22, legacy=False, shards=True,
         cfg=base(rms_norm_eps=1e-5), rope=rope(10000.0)),
    dict(name="llama-f16", arch="llama", seed=111, T=25, legacy=False, save_dtype="float16",
         cfg=base(rms_norm_eps=1e-6), rope=rope(500000.0)),
    dict(name="llama-headdim", arch="llama", seed=112, T=27, legacy=False,
         cfg=base(head_dim=32, rms_norm_eps=1e-5), rope=rope(1000000.0)),
    # Qwen3: q and k RMS-normalized per head (q_norm, k_norm over head_dim)
    # before RoPE, no q/k/v bias, a head_dim of its own (4 heads of 32 from a
    # hidden size of 64), untied embeddings as Qwen3-8B's.
    dict(name="qwen3-qknorm", arch="qwen3", seed=113, T=29, legacy=False,
         cfg=base(head_dim=32, rms_norm_eps=1e-6, attention_bias=False),
         rope=rope(1000000.0)),
    # Phi-3 (the 4k models' layout): fused qkv_proj and gate_up_proj, GQA,
    # no sliding window within the prompt.
    dict(name="phi3-fused", arch="phi3", seed=114, T=31, legacy=False,
         cfg=base(rms_norm_eps=1e-5, pad_token_id=0, sliding_window=None), rope=rope(10000.0)),
    # Phi-3's long-context scaling (longrope, as Phi-3-mini-128k): 128
    # positions over an original 32, short and long factors of each pair,
    # the attention factor derived from the extension (sqrt(1 + ln 4 / ln
    # 32)). The prompt (40 tokens) is past the original context, where
    # transformers rotates every position by the long factors (as kiln does
    # in any context past the original one).
    dict(name="phi3-longrope", arch="phi3", seed=117, T=40, legacy=False,
         cfg=base(rms_norm_eps=1e-5, pad_token_id=0, sliding_window=None, max_position_embeddings=128,
                  original_max_position_embeddings=32),
         rope=rope(10000.0, "longrope", short_factor=[1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.6, 3.2],
                   long_factor=[1.0, 1.2, 1.8, 2.7, 4.0, 6.0, 9.0, 12.0])),
    # The short factors: a model of 64 positions, all of them original
    # (kiln's context, the model's own, is within the original one, as
    # every sequence transformers runs here), and an attention factor given.
    dict(name="phi3-longrope-short", arch="phi3", seed=123, T=30, legacy=False,
         cfg=base(rms_norm_eps=1e-5, pad_token_id=0, sliding_window=None, max_position_embeddings=64,
                  original_max_position_embeddings=64),
         rope=rope(10000.0, "longrope", short_factor=[1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.6, 3.2],
                   long_factor=[1.0, 1.2, 1.8, 2.7, 4.0, 6.0, 9.0, 12.0], attention_factor=1.15)),
    # Mixtures of experts (added in session 19, not yet run: see which
    # layout transformers 5 saves the experts in, per expert as the Hub's
    # checkpoints or fused gate_up_proj / down_proj, which manual_forward
    # reads either way). Mixtral: the softmax over the chosen two of four.
    dict(name="mixtral-moe", arch="mixtral", seed=115, T=23, legacy=False,
         cfg=base(num_local_experts=4, num_experts_per_tok=2, sliding_window=None, rms_norm_eps=1e-5),
         rope=rope(1000000.0)),
    # Qwen3-MoE: q/k norms per head, experts of moe_intermediate_size, the
    # softmax over every expert (norm_topk_prob false).
    dict(name="qwen3-moe", arch="qwen3_moe", seed=116, T=25, legacy=False,
         cfg=base(head_dim=32, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, norm_topk_prob=False,
                  decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6),
         rope=rope(1000000.0)),
    # Qwen2-MoE (session 21, not yet run): q/k/v biases, experts weighted
    # by the softmax over every expert, and a shared expert of 40 rows
    # scaled by the sigmoid of its gate.
    dict(name="qwen2-moe-shared", arch="qwen2_moe", seed=122, T=27, legacy=False,
         cfg=base(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48, shared_expert_intermediate_size=40,
                  norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                  qkv_bias=True, rms_norm_eps=1e-6),
         rope=rope(1000000.0)),
    # OLMoE (session 20, not yet run): q and k RMS-normalized over all heads
    # at once, experts weighted by their probabilities over every expert.
    dict(name="olmoe-moe", arch="olmoe", seed=121, T=26, legacy=False,
         cfg=base(num_key_value_heads=4, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, clip_qkv=None,
                  rms_norm_eps=1e-5),
         rope=rope(10000.0)),
    # Gemma (session 20, not yet run): the embeddings scaled by sqrt(64) = 8,
    # norms of 1+w, GeGLU (gelu_pytorch_tanh), MQA-like GQA, tied.
    dict(name="gemma-geglu", arch="gemma", seed=118, T=24, legacy=False,
         cfg=base(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                  head_dim=16, rms_norm_eps=1e-6),
         rope=rope(10000.0)),
    # Gemma 2: sandwich norms, soft-capped attention scores (cap 2) and
    # logits (cap 3), small enough to bend them at these weights; the query
    # scale of query_pre_attn_scalar 24 (not head_dim 16); windowed layers
    # (8) every other from the first, the prompt past the window.
    dict(name="gemma2-softcap", arch="gemma2", seed=119, T=30, legacy=False,
         cfg=base(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                  head_dim=16, num_hidden_layers=3, query_pre_attn_scalar=24, attn_logit_softcapping=2.0,
                  final_logit_softcapping=3.0, sliding_window=8, rms_norm_eps=1e-6),
         rope=rope(10000.0)),
    # Gemma 3 (text): q/k norms of 1+w, windowed layers (8) with a RoPE base
    # of their own (local 10000, unscaled) and a global layer of base 1e6
    # with linear scaling 2, by layer_types.
    dict(name="gemma3-local", arch="gemma3", seed=120, T=29, legacy=False,
         cfg=base(hidden_act="gelu_pytorch_tanh", hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
                  head_dim=16, num_hidden_layers=3, query_pre_attn_scalar=16, sliding_window=8,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention"], rms_norm_eps=1e-6,
                  rope_local_base_freq=10000.0),
         rope={"full_attention": rope(1000000.0, "linear", factor=2.0), "sliding_attention": rope(10000.0)}),
]

ARCH_CLASSES = {"llama": "LlamaConfig", "qwen2": "Qwen2Config", "mistral": "MistralConfig", "qwen3": "Qwen3Config",
                "phi3": "Phi3Config", "mixtral": "MixtralConfig", "qwen3_moe": "Qwen3MoeConfig", "qwen2_moe": "Qwen2MoeConfig",
                "gemma": "GemmaConfig", "gemma2": "Gemma2Config", "gemma3": "Gemma3TextConfig",
                "olmoe": "OlmoeConfig"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def make_config(spec, notes):
    cls = getattr(transformers, ARCH_CLASSES[spec["arch"]])
    kw = dict(spec["cfg"])
    kw["rope_parameters"] = dict(spec["rope"])
    dropped = []
    for _ in range(20):
        try:
            cfg = cls(**kw)
            break
        except TypeError as e:
            msg = str(e)
            bad = [k for k in kw if ("'%s'" % k) in msg]
            if not bad:
                raise
            for k in bad:
                if k == "rope_parameters":  # pre-v5 API fallback
                    r = dict(kw.pop(k))
                    kw["rope_theta"] = r.pop("rope_theta")
                    if r.get("rope_type", "default") != "default":
                        kw["rope_scaling"] = r
                else:
                    kw.pop(k)
                dropped.append(k)
    else:
        raise RuntimeError("could not build config")
    if dropped:
        notes.append("config kwargs not accepted by %s and dropped: %s" % (cls.__name__, dropped))
    return cfg


def randomize(model, seed, tied):
    g = torch.Generator().manual_seed(seed * 7919 + 13)
    with torch.no_grad():
        for n, p in model.named_parameters():
            shape = p.shape
            if "norm" in n and n.endswith("weight") and model.config.model_type.startswith("gemma"):
                v = NORM_NOISE * torch.randn(shape, generator=g)  # Gemma scales by 1+w
            elif "norm" in n and n.endswith("weight"):
                v = 1.0 + NORM_NOISE * torch.randn(shape, generator=g)
            elif n.endswith(".bias"):
                v = BIAS_STD * torch.randn(shape, generator=g)
            elif "embed_tokens" in n:
                v = (TIED_STD if tied else EMB_STD) * torch.randn(shape, generator=g)
            elif "lm_head" in n:
                v = HEAD_STD * torch.randn(shape, generator=g)
            else:
                v = W_STD * torch.randn(shape, generator=g)
            p.copy_(v.to(p.dtype))


def save_model(model, d, max_shard_size=None):
    if os.path.isdir(d):
        shutil.rmtree(d)
    kw = {}
    if max_shard_size is not None:
        kw["max_shard_size"] = max_shard_size
    try:
        model.save_pretrained(d, safe_serialization=True, **kw)
    except TypeError:
        model.save_pretrained(d, **kw)
    for f in os.listdir(d):
        if not (f == "config.json" or f.endswith(".safetensors") or f == "model.safetensors.index.json"):
            os.remove(os.path.join(d, f))


def load_f32(d, config=None):
    kw = dict(attn_implementation="eager")
    if config is not None:
        kw["config"] = config
    try:
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw)
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32, **kw)
    m.eval()
    m.generation_config = GenerationConfig(bos_token_id=1, pad_token_id=0, eos_token_id=None,
                                           do_sample=False, num_beams=1)
    return m


def forward_logits(m, ids):
    with torch.no_grad():
        out = m(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False)
    return out.logits[0].float()


def eff_head_dim(cfg):
    hd = getattr(cfg, "head_dim", None)
    return hd if hd else cfg.hidden_size // cfg.num_attention_heads


def rope_params(cfg):
    rp = getattr(cfg, "rope_parameters", None)
    if rp:
        return dict(rp)
    r = dict(getattr(cfg, "rope_scaling", None) or {})
    r.setdefault("rope_type", r.get("type", "default"))
    r["rope_theta"] = getattr(cfg, "rope_theta", 10000.0)
    return r


def expected_inv_freq(cfg):
    """Independent float64 computation of the RoPE inverse frequencies."""
    rp = rope_params(cfg)
    hd = eff_head_dim(cfg)
    theta = float(rp["rope_theta"])
    inv = [1.0 / theta ** (2 * i / hd) for i in range(hd // 2)]
    t = rp.get("rope_type", "default")
    bands = None
    if t == "linear":
        inv = [x / rp["factor"] for x in inv]
    elif t == "llama3":
        f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        old = rp["original_max_position_embeddings"]
        lo_wl, hi_wl = old / lo, old / hi
        out, bands = [], []
        for x in inv:
            wl = 2 * math.pi / x
            if wl < hi_wl:
                out.append(x)
                bands.append("kept")
            elif wl > lo_wl:
                out.append(x / f)
                bands.append("divided")
            else:
                s = (old / wl - lo) / (hi - lo)
                out.append((1 - s) * x / f + s * x)
                bands.append("smoothed")
        inv = out
    elif t == "longrope":
        # The long factors once past original_max_position_embeddings (the
        # prompt of phi3-longrope is, and transformers keeps the long
        # frequencies after it), the short ones within it.
        orig = getattr(cfg, "original_max_position_embeddings", None) or rp.get("original_max_position_embeddings")
        use = "long_factor" if cfg.max_position_embeddings > orig else "short_factor"
        inv = [x / f for x, f in zip(inv, rp[use])]
    elif t != "default":
        raise ValueError("no independent formula for rope_type %r" % t)
    return inv, bands


def manual_forward(m, ids, window=None, window_inclusive=False):
    """Plain-torch Llama/Qwen2/Qwen3/Mistral/Phi-3/Mixtral/Qwen3-MoE/Qwen2-MoE forward (fp32) from the loaded weights."""
    cfg = m.config
    sd = {k: v.detach().float() for k, v in m.state_dict().items()}
    H, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = eff_head_dim(cfg)
    eps = cfg.rms_norm_eps
    ids = ids[0]
    T = ids.shape[0]
    re = m.model.rotary_emb
    inv = re.inv_freq.detach().float()
    sc = float(getattr(re, "attention_scaling", 1.0))
    pos = torch.arange(T, dtype=torch.float32)
    fr = pos[:, None] * inv[None, :]
    emb = torch.cat([fr, fr], dim=-1)
    cos, sin = emb.cos() * sc, emb.sin() * sc

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    # Phi-3 stores q/k/v and gate/up fused: take them apart by rows.
    for key in list(sd):
        if key.endswith("self_attn.qkv_proj.weight"):
            pre = key[: -len("qkv_proj.weight")]
            q_, k_, v_ = sd.pop(key).split([nh * hd, nkv * hd, nkv * hd], dim=0)
            sd[pre + "q_proj.weight"], sd[pre + "k_proj.weight"], sd[pre + "v_proj.weight"] = q_, k_, v_
        if key.endswith("mlp.gate_up_proj.weight"):
            pre = key[: -len("gate_up_proj.weight")]
            g_, u_ = sd.pop(key).chunk(2, dim=0)
            sd[pre + "gate_proj.weight"], sd[pre + "up_proj.weight"] = g_, u_

    def lin(x, p):
        y = x @ sd[p + ".weight"].T
        b = sd.get(p + ".bias")
        return y + b if b is not None else y

    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    def expert(p, e):
        """Expert e's gate, up and down matrices: stored one by one (the
        Hub's w1/w3/w2 or gate_proj/up_proj/down_proj) or fused
        (transformers 5: gate_up_proj [E, 2I, H], down_proj [E, H, I])."""
        for pre, names in ((p + "block_sparse_moe.experts.%d." % e, ("w1", "w3", "w2")),
                           (p + "mlp.experts.%d." % e, ("gate_proj", "up_proj", "down_proj"))):
            if pre + names[0] + ".weight" in sd:
                return tuple(sd[pre + n + ".weight"] for n in names)
        for pre in (p + "block_sparse_moe.experts.", p + "mlp.experts."):
            if pre + "gate_up_proj" in sd:
                g, u = sd[pre + "gate_up_proj"][e].chunk(2, dim=0)
                return g, u, sd[pre + "down_proj"][e]
        raise KeyError("no weights of expert %d under %s" % (e, p))

    def moe(h, p, router):
        """Each row to its top-k experts by router logit, weighted by the
        softmax over every expert, renormalized over the chosen ones when
        the model does (Mixtral always; Qwen3-MoE with norm_topk_prob)."""
        k = cfg.num_experts_per_tok
        probs = torch.softmax(h @ router.T, dim=-1)
        w, idx = probs.topk(k, dim=-1)
        if getattr(cfg, "norm_topk_prob", True):
            w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(router.shape[0]):
            g, u, d = expert(p, e)
            y = (torch.nn.functional.silu(h @ g.T) * (h @ u.T)) @ d.T
            out = out + (w * (idx == e)).sum(-1, keepdim=True) * y
        s = p + "mlp.shared_expert."
        if s + "gate_proj.weight" in sd:  # Qwen2-MoE: a shared expert, gated by sigmoid
            y = (torch.nn.functional.silu(h @ sd[s + "gate_proj.weight"].T) * (h @ sd[s + "up_proj.weight"].T)) @ sd[s + "down_proj.weight"].T
            out = out + torch.sigmoid(h @ sd[p + "mlp.shared_expert_gate.weight"].T) * y
        return out

    qi = torch.arange(T)[:, None]
    ki = torch.arange(T)[None, :]
    allowed = ki <= qi
    if window is not None:
        allowed = allowed & ((qi - ki <= window) if window_inclusive else (qi - ki < window))

    x = sd["model.embed_tokens.weight"][ids]
    for l in range(cfg.num_hidden_layers):
        p = "model.layers.%d." % l
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = lin(h, p + "self_attn.q_proj").view(T, nh, hd)
        k = lin(h, p + "self_attn.k_proj").view(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in sd:  # Qwen3: per head, over head_dim
            q = rms(q, sd[p + "self_attn.q_norm.weight"])
            k = rms(k, sd[p + "self_attn.k_norm.weight"])
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        v = lin(h, p + "self_attn.v_proj").view(T, nkv, hd).transpose(0, 1)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        k = k.repeat_interleave(nh // nkv, dim=0)
        v = v.repeat_interleave(nh // nkv, dim=0)
        s = (q @ k.transpose(1, 2)) * hd ** -0.5
        s = s.masked_fill(~allowed, float("-inf"))
        a = torch.softmax(s, dim=-1) @ v
        x = x + lin(a.transpose(0, 1).reshape(T, nh * hd), p + "self_attn.o_proj")
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        router = sd.get(p + "block_sparse_moe.gate.weight", sd.get(p + "mlp.gate.weight"))
        if router is not None:
            x = x + moe(h, p, router)
            continue
        g = lin(h, p + "mlp.gate_proj")
        u = lin(h, p + "mlp.up_proj")
        x = x + lin(torch.nn.functional.silu(g) * u, p + "mlp.down_proj")
    x = rms(x, sd["model.norm.weight"])
    w = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
    return x @ w.T


def greedy(m, ids):
    """generate() (KV cache) and a no-cache argmax loop; returns dict of results."""
    T = ids.shape[1]
    res = {}
    with torch.no_grad():
        go = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                        do_sample=False, num_beams=1, pad_token_id=0, eos_token_id=None,
                        return_dict_in_generate=True, output_logits=True)
    gen_ids = go.sequences[0, T:].tolist()
    gen_logits = [l[0].float() for l in (go.logits or [])]
    cur = ids
    nc_ids, margins, dec_logits, diffs = [], [], [], []
    with torch.no_grad():
        for step in range(NEW_TOKENS):
            lg = m(input_ids=cur, attention_mask=torch.ones_like(cur), use_cache=False).logits[0, -1].float()
            top = lg.topk(2).values
            margins.append(float(top[0] - top[1]))
            dec_logits.append(lg)
            if step < len(gen_logits):
                diffs.append(float((lg - gen_logits[step]).abs().max()))
            nxt = int(lg.argmax())
            nc_ids.append(nxt)
            cur = torch.cat([cur, torch.tensor([[nxt]], dtype=cur.dtype)], dim=1)
    res["generate_ids"] = gen_ids
    res["nocache_ids"] = nc_ids
    res["margins"] = margins
    res["decode_logits"] = torch.stack(dec_logits)
    res["cache_vs_nocache_step_logits_max_abs_diff"] = max(diffs) if diffs else None
    return res


def tensor_listing(d):
    from safetensors import safe_open
    out = {}
    for f in sorted(os.listdir(d)):
        if not f.endswith(".safetensors"):
            continue
        with safe_open(os.path.join(d, f), framework="pt") as sf:
            for k in sf.keys():
                sl = sf.get_slice(k)
                out[k] = {"file": f, "dtype": str(sl.get_dtype()), "shape": list(sl.get_shape())}
    return out


def to_legacy(cd):
    """transformers-5 config dict -> the pre-v5 layout (rope_theta/rope_scaling/torch_dtype)."""
    d = dict(cd)
    rp = d.pop("rope_parameters", None)
    if rp is None:
        return d
    rp = dict(rp)
    theta = rp.pop("rope_theta", None)
    if theta is not None:
        d["rope_theta"] = theta
    d["rope_scaling"] = None if rp.get("rope_type", "default") == "default" else rp
    if "dtype" in d and "torch_dtype" not in d:
        d["torch_dtype"] = d.pop("dtype")
    return d


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=False)
        f.write("\n")


# --------------------------------------------------------------------------
# one variant
# --------------------------------------------------------------------------

def run_variant(spec, out_root):
    name, seed, T = spec["name"], spec["seed"], spec["T"]
    notes = []
    checks = {}
    d = os.path.join(out_root, name)
    log("=== %s" % name)
    torch.manual_seed(seed)
    cfg = make_config(spec, notes)
    model = AutoModelForCausalLM.from_config(cfg)
    model.eval()
    tied = bool(spec["cfg"].get("tie_word_embeddings"))
    randomize(model, seed, tied)
    if tied:
        if hasattr(model, "tie_weights"):
            model.tie_weights()
        checks["tied_in_built_model"] = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    save_dtype = spec.get("save_dtype", "float32")
    if save_dtype != "float32":
        model = model.to(DTYPES[save_dtype])
    orig_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}

    # ---- save
    if spec.get("shards"):
        total = sum(v.numel() * v.element_size() for k, v in orig_sd.items()
                    if not (tied and k == "lm_head.weight"))
        chosen = None
        for div in (2.5, 2.2, 2.8, 2.0, 3.2, 1.8):
            size = int(total / div)
            save_model(model, d, max_shard_size=size)
            n = len([f for f in os.listdir(d) if f.endswith(".safetensors")])
            log("  shard try max_shard_size=%d -> %d shards" % (size, n))
            if 2 <= n <= 3:
                chosen = (size, n)
                break
        notes.append("saved with save_pretrained(max_shard_size=%s bytes) -> %s shards + "
                     "model.safetensors.index.json" % chosen if chosen else "could not get 2-3 shards")
        checks["max_shard_size_bytes"] = chosen[0] if chosen else None
    else:
        save_model(model, d)

    # ---- reload what is on disk (native v5 config first)
    ref = load_f32(d)
    checks["attn_implementation"] = getattr(ref.config, "_attn_implementation", None)
    if checks["attn_implementation"] != "eager":
        notes.append("attn implementation is %r, not eager" % checks["attn_implementation"])
    ids = [1] + torch.randint(3, cfg.vocab_size, (T - 1,),
                              generator=torch.Generator().manual_seed(seed + 2000)).tolist()
    ids_t = torch.tensor([ids], dtype=torch.long)
    logits = forward_logits(ref, ids_t)
    assert logits.shape == (T, cfg.vocab_size), logits.shape

    # weights on disk == built weights (upcast)
    rsd = ref.state_dict()
    wdiff = 0.0
    missing = []
    for k, v in orig_sd.items():
        if k not in rsd:
            missing.append(k)
            continue
        wdiff = max(wdiff, float((rsd[k].float() - v.float()).abs().max()))
    checks["reload_weight_max_abs_diff"] = wdiff
    if missing:
        notes.append("keys missing after reload: %s" % missing)
    checks["reloaded_param_dtypes"] = sorted({str(v.dtype) for v in rsd.values()})
    if tied:
        checks["tied_in_reloaded_model"] = ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()

    # ---- config format: optionally rewrite config.json into the pre-v5 layout
    cpath = os.path.join(d, "config.json")
    with open(cpath) as f:
        native_text = f.read()
    native_cd = json.loads(native_text)
    config_format = "transformers-5 (rope_parameters)"
    if spec.get("legacy"):
        try:
            with open(cpath, "w") as f:
                f.write(json.dumps(to_legacy(native_cd), indent=2, sort_keys=True) + "\n")
            ref2 = load_f32(d)
            l2 = forward_logits(ref2, ids_t)
            same_rope = torch.equal(ref2.model.rotary_emb.inv_freq, ref.model.rotary_emb.inv_freq)
            if not same_rope:
                raise RuntimeError("legacy config changes inv_freq")
            if torch.equal(l2, logits):
                config_format = "legacy (rope_theta/rope_scaling/torch_dtype, rewritten by this script)"
                notes.append("config.json rewritten to the pre-transformers-5 layout (top-level rope_theta, "
                             "rope_scaling, torch_dtype); transformers 5 loads it to bit-identical logits")
                ref = ref2
            else:
                raise RuntimeError("legacy config changes logits by %g" % float((l2 - logits).abs().max()))
        except Exception as e:  # keep the native file
            with open(cpath, "w") as f:
                f.write(native_text)
            notes.append("legacy config rewrite rejected (%s); native transformers-5 config kept" % e)
    checks["config_format"] = config_format

    # ---- independent checks
    rcfg = ref.config
    att_scale = float(getattr(ref.model.rotary_emb, "attention_scaling", 1.0))
    hf_inv = None  # Gemma 3's rotary embedding may keep its frequencies per layer type
    try:
        hf_inv = ref.model.rotary_emb.inv_freq.detach().double().tolist()
        exp_inv, bands = expected_inv_freq(rcfg)
        checks["inv_freq_max_rel_diff_vs_formula"] = max(abs(a - b) / b for a, b in zip(hf_inv, exp_inv))
        if bands:
            checks["llama3_bands"] = bands
    except Exception as e:
        notes.append("inv_freq formula check failed: %s" % e)

    window = getattr(rcfg, "sliding_window", None) if spec["arch"] == "mistral" else None
    if spec["arch"] == "qwen2" and getattr(rcfg, "use_sliding_window", False):
        window = rcfg.sliding_window
    if spec["arch"].startswith("gemma") or spec["arch"] == "olmoe":
        notes.append("no manual forward for %s (Gemma's norms, soft-capping and local RoPE, OLMoE's whole-width "
                     "q/k norms are not in it): the fixture rests on transformers' own forward and generate()"
                     % spec["arch"])
    else:
        man = manual_forward(ref, ids_t, window=window, window_inclusive=False)
        checks["manual_max_abs_diff"] = float((man - logits).abs().max())
        log("  manual forward max|diff| = %.3g" % checks["manual_max_abs_diff"])

    if spec["arch"] == "mistral":
        probe = {}
        man_le = manual_forward(ref, ids_t, window=window, window_inclusive=True)
        man_full = manual_forward(ref, ids_t, window=None)
        probe["manual_q_minus_k_lt_window_max_abs_diff"] = checks["manual_max_abs_diff"]
        probe["manual_q_minus_k_le_window_max_abs_diff"] = float((man_le - logits).abs().max())
        probe["manual_no_window_max_abs_diff"] = float((man_full - logits).abs().max())
        cfg_nw = AutoConfig.from_pretrained(d)
        cfg_nw.sliding_window = None
        nw = load_f32(d, config=cfg_nw)
        lnw = forward_logits(nw, ids_t)
        per_pos = (lnw - logits).abs().max(dim=-1).values.tolist()
        probe["hf_vs_hf_no_window_per_position_max_abs_diff"] = per_pos
        first = next((i for i, x in enumerate(per_pos) if x > 0), None)
        probe["first_position_differing_from_no_window"] = first
        lt, le = probe["manual_q_minus_k_lt_window_max_abs_diff"], probe["manual_q_minus_k_le_window_max_abs_diff"]
        if lt < 1e-4 and le > 1e-3:
            sem = "query i attends key j iff 0 <= i-j < sliding_window (each query sees sliding_window keys, itself included)"
        elif le < 1e-4 and lt > 1e-3:
            sem = "query i attends key j iff 0 <= i-j <= sliding_window (sliding_window+1 keys, itself included)"
        else:
            sem = "UNDETERMINED (lt diff %g, le diff %g)" % (lt, le)
        probe["semantics"] = sem
        checks["sliding_window_probe"] = probe
        if first is not None and all(x == 0 for x in per_pos[:first]) and all(x > 0 for x in per_pos[first:]):
            notes.append("sliding window %d took effect: logits equal the sliding_window=None model exactly at "
                         "positions < %d and differ at every position >= %d; mask semantics: %s"
                         % (window, first, first, sem))
        else:
            notes.append("sliding window check UNEXPECTED: per-position diffs vs no-window %s; mask semantics: %s"
                         % (per_pos, sem))
        log("  window probe:", json.dumps({k: v for k, v in probe.items() if "per_position" not in k}))

    # ---- greedy
    g = greedy(ref, ids_t)
    checks["generate_len"] = len(g["generate_ids"])
    checks["generate_equals_nocache_loop"] = g["generate_ids"] == g["nocache_ids"]
    checks["cache_vs_nocache_step_logits_max_abs_diff"] = g["cache_vs_nocache_step_logits_max_abs_diff"]
    checks["greedy_top1_top2_margin_min"] = min(g["margins"])
    checks["greedy_distinct_tokens"] = len(set(g["generate_ids"]))
    checks["prefill_top1_top2_margin_min"] = float(
        min((r.topk(2).values[0] - r.topk(2).values[1]) for r in logits))
    if not checks["generate_equals_nocache_loop"]:
        notes.append("generate() (KV cache) and the no-cache argmax loop DISAGREE; greedy_ids is generate's, "
                     "greedy_ids_nocache the loop's")
    if checks["generate_len"] != NEW_TOKENS:
        notes.append("generate returned %d new tokens, not %d" % (checks["generate_len"], NEW_TOKENS))
    log("  greedy:", g["generate_ids"], "nocache equal:", checks["generate_equals_nocache_loop"],
        "min margin %.4f" % checks["greedy_top1_top2_margin_min"],
        "cache/nocache step diff %s" % checks["cache_vs_nocache_step_logits_max_abs_diff"])

    # ---- write outputs
    with open(os.path.join(d, "logits.bin"), "wb") as f:
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())
    with open(os.path.join(d, "decode_logits.bin"), "wb") as f:
        f.write(g["decode_logits"].contiguous().numpy().astype("<f4").tobytes())

    rp = rope_params(rcfg)
    summary = {
        "arch": spec["arch"],
        "architectures": getattr(rcfg, "architectures", None),
        "hidden_size": rcfg.hidden_size,
        "intermediate_size": rcfg.intermediate_size,
        "num_hidden_layers": rcfg.num_hidden_layers,
        "num_attention_heads": rcfg.num_attention_heads,
        "num_key_value_heads": rcfg.num_key_value_heads,
        "head_dim": eff_head_dim(rcfg),
        "vocab_size": rcfg.vocab_size,
        "max_position_embeddings": rcfg.max_position_embeddings,
        "rms_norm_eps": rcfg.rms_norm_eps,
        "rope": rp,
        "sliding_window": window,
        "tie_word_embeddings": bool(getattr(rcfg, "tie_word_embeddings", False)),
        "attention_bias_qkv": spec["arch"] == "qwen2" or bool(getattr(rcfg, "attention_bias", False)),
        "qk_norm": spec["arch"] == "qwen3",
        "weights_dtype": save_dtype,
    }
    if save_dtype != "float32":
        notes.append("weights saved in %s; reference computed by loading the saved %s weights with "
                     "from_pretrained(dtype=float32), i.e. %s weights upcast, float32 math" %
                     (save_dtype, save_dtype, save_dtype))
    notes.append("logits.bin: float32 LE [T=%d, V=%d], one forward pass over input_ids (no cache). "
                 "decode_logits.bin: float32 LE [%d, V], row i = last-position logits of a full no-cache forward "
                 "over input_ids + greedy_ids_nocache[:i]" % (T, rcfg.vocab_size, NEW_TOKENS))
    notes.append("greedy: generate(max_new_tokens=%d, do_sample=False, num_beams=1, eos_token_id=None, "
                 "pad_token_id=0), model.generation_config replaced by a bare one (no EOS, no processors)" %
                 NEW_TOKENS)
    exp = {
        "variant": name,
        "input_ids": ids,
        "greedy_ids": g["generate_ids"],
        "greedy_ids_nocache": g["nocache_ids"],
        "logits_shape": [T, rcfg.vocab_size],
        "decode_logits_shape": [NEW_TOKENS, rcfg.vocab_size],
        "dtype": "float32",
        "weights_dtype": save_dtype,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "notes": " | ".join(notes),
        "config": summary,
        "config_format": config_format,
        "inv_freq": hf_inv,
        "rope_attention_scaling": att_scale,
        "files": sorted(os.listdir(d)),
        "tensors": tensor_listing(d),
        "checks": checks,
        "greedy_top1_top2_margins": g["margins"],
        "seed": seed,
        "init": {"linear_std": W_STD, "embed_std": TIED_STD if tied else EMB_STD, "lm_head_std": HEAD_STD,
                 "norm_weight": "1 + N(0, %g^2)" % NORM_NOISE, "bias_std": BIAS_STD},
    }
    exp["files"] = sorted(set(exp["files"]) | {"expected.json"})
    write_json(os.path.join(d, "expected.json"), exp)
    ok = (checks.get("manual_max_abs_diff", 0.0) < 1e-4 and checks["reload_weight_max_abs_diff"] == 0.0)
    if not ok:
        log("  WARNING: self-check failed for", name)
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--only", default="")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    log("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)
    only = set(x for x in a.only.split(",") if x)
    failed = []
    for spec in VARIANTS:
        if only and spec["name"] not in only:
            continue
        try:
            if not run_variant(spec, a.out):
                failed.append(spec["name"] + " (self-check)")
        except Exception:
            log(traceback.format_exc())
            failed.append(spec["name"])
            shutil.rmtree(os.path.join(a.out, spec["name"]), ignore_errors=True)
    log("FAILED:", failed if failed else "none")
    with open(os.path.join(a.out, "make_fixtures.log"), "w") as f:
        f.write("\n".join(LOG) + "\n")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
