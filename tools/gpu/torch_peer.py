"""The PyTorch/transformers peer of `kiln bench model --random llama3-8b` on
the GPU machine: the same shape with random bf16 weights, measured the same
way (median of reps after a warm-up), printed as one JSON object.

    python3 tools/gpu/torch_peer.py [--depth 512] [--tg 128] [--batch 1,16,64,256] [--pp 2048] [--compile] [--attention-only]

Figures: device-to-device copy bandwidth (bytes read + written per second), a
large bf16 GEMM's TFLOP/s, prefill tokens/s of one pp-token prompt, and
decode tokens/s of `batch` sequences that hold `depth` tokens of context,
greedy, with transformers' DynamicCache (eager). --compile adds batch-1
decode through generate() with a static cache, for which transformers
compiles the decoding forward itself (torch.compile, mode
"reduce-overhead"). Also PyTorch's attention alone
(scaled_dot_product_attention) on the shapes of kiln's kernel benchmarks.
"""
import argparse
import json
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def cuda_time(fn, reps):
    times = []
    for i in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if i > 0:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def event_time(fn, reps=20):
    """Median of reps CUDA-event timings of fn, after a warm-up, in seconds."""
    fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def random_model(cls, cfg):
    """cls(cfg) on the GPU in bf16, every parameter drawn from N(0, 0.02²)
    after torch.manual_seed(0)."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = cls(cfg).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    return model


def prefill_rate(model, vocab, pp, reps):
    """Tokens/s of one forward over a random pp-token prompt (the last
    position's logits), the median of reps after a warm-up."""
    ids = torch.randint(0, vocab, (1, pp), device="cuda")
    return pp / cuda_time(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), reps)


def decode_rate(model, vocab, batch, depth, tg, reps):
    """Tokens/s of tg greedy steps of batch sequences holding depth random
    tokens each (DynamicCache, eager), the median of reps after a
    warm-up."""
    from transformers import DynamicCache
    prompt = torch.randint(0, vocab, (batch, depth), device="cuda")
    times = []
    for rep in range(reps + 1):
        cache = DynamicCache()
        o = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        tok = o.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(tg):
            o = model(input_ids=tok, past_key_values=cache, use_cache=True)
            tok = o.logits[:, -1].argmax(-1, keepdim=True)
        torch.cuda.synchronize()
        if rep > 0:
            times.append(time.perf_counter() - t0)
        del cache, o
        torch.cuda.empty_cache()
    return batch * tg / statistics.median(times)


def sdpa_backends(q, k, v, causal, flops):
    """The TFLOP/s of each of PyTorch's SDPA backends that takes these
    operands (flash, cuDNN, memory-efficient), each forced alone; a backend
    that refuses them is left out."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    res = {}
    for b in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        try:
            with sdpa_kernel(b):
                t = event_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))
            res[b.name] = flops / t / 1e12
        except RuntimeError:
            continue
    return res


def attention_alone():
    """PyTorch's scaled_dot_product_attention on the shapes of kiln's kernel
    benchmarks (backend/cuda/kernels): prefill of 4096 tokens, 32 query and 8
    KV heads of 128 (GQA), causal and not, and of 2048 causal (the model's
    prefill), in model TFLOP/s (4·T·T·d·heads, halved when causal); decode
    of one token over 512 and 4096 cached tokens, in GB/s of K and V read.
    Each prefill also by each backend forced alone (sdpa_backends)."""
    import torch.nn.functional as F
    res = {}
    H, KV, D = 32, 8, 128
    for T, causal, name in ((4096, True, "prefill_causal"), (4096, False, "prefill_full"), (2048, True, "prefill_causal2048")):
        q = torch.randn(1, H, T, D, dtype=torch.bfloat16, device="cuda")
        k = torch.randn(1, KV, T, D, dtype=torch.bfloat16, device="cuda")
        v = torch.randn(1, KV, T, D, dtype=torch.bfloat16, device="cuda")
        t = event_time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True))
        flops = 4 * T * T * D * H / (2 if causal else 1)
        res[name] = {"tokens": T, "ms": t * 1e3, "tflops": flops / t / 1e12,
                     "backends_tflops": sdpa_backends(q, k, v, causal, flops)}
    for ctx in (512, 4096):
        q1 = torch.randn(1, H, 1, D, dtype=torch.bfloat16, device="cuda")
        kc = torch.randn(1, KV, ctx, D, dtype=torch.bfloat16, device="cuda")
        vc = torch.randn(1, KV, ctx, D, dtype=torch.bfloat16, device="cuda")
        t = event_time(lambda: F.scaled_dot_product_attention(q1, kc, vc, enable_gqa=True))
        res[f"decode_ctx{ctx}"] = {"us": t * 1e6, "gb_per_s": 2 * ctx * KV * D * 2 / t / 1e9}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--pp", type=int, default=2048)
    ap.add_argument("--batch", default="1,16,64,256")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--llama31", action="store_true", help="Llama 3.1's 131,072 positions by llama3 RoPE scaling")
    ap.add_argument("--attention-only", action="store_true", help="PyTorch's attention alone (attention_alone), then stop")
    a = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    import transformers
    out["transformers"] = transformers.__version__

    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(1)
    dst = torch.empty_like(src)
    out["copy_bytes_per_s"] = 2 * n / cuda_time(lambda: dst.copy_(src), 5)
    del src, dst
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    out["gemm_tflops"] = 2 * m**3 / cuda_time(lambda: x @ y, 10) / 1e12
    # The layout of a model's products (and of kiln's reference GEMM):
    # x·yᵀ, as torch.nn.functional.linear computes it.
    out["gemm_linear_tflops"] = 2 * m**3 / cuda_time(lambda: torch.nn.functional.linear(x, y), 10) / 1e12
    del x, y

    out["attention"] = attention_alone()
    if a.attention_only:
        print(json.dumps(out, indent=1))
        return

    shape = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=a.layers,
                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    if a.llama31:
        # kiln's llama3.1-8b shape (bench/random.go): transformers 5 takes
        # rope_parameters, 4 rope_scaling.
        scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192}
        try:
            cfg = LlamaConfig(**shape, max_position_embeddings=131072,
                              rope_parameters={**scaling, "rope_theta": 500000.0})
        except TypeError:
            cfg = LlamaConfig(**shape, max_position_embeddings=131072, rope_theta=500000.0, rope_scaling=scaling)
        out["config"] = "llama3.1"
    else:
        cfg = LlamaConfig(**shape, max_position_embeddings=8192, rope_theta=500000.0)
    model = random_model(LlamaForCausalLM, cfg)
    out["params"] = sum(p.numel() for p in model.parameters())
    vocab = cfg.vocab_size

    with torch.inference_mode():
        if a.pp > 0:
            out["pp"] = {"tokens": a.pp, "tokens_per_s": prefill_rate(model, vocab, a.pp, a.reps)}

        out["tg"] = []
        for b in [int(x) for x in a.batch.split(",") if x]:
            try:
                out["tg"].append({"batch": b, "depth": a.depth, "tokens": a.tg,
                                  "tokens_per_s": decode_rate(model, vocab, b, a.depth, a.tg, a.reps)})
            except torch.OutOfMemoryError as e:
                out["tg"].append({"batch": b, "error": "out of memory"})
                torch.cuda.empty_cache()
            print(json.dumps(out["tg"][-1]), file=sys.stderr, flush=True)

        if a.compile:
            # transformers' own static-cache path: generate() with
            # cache_implementation="static" and the forward compiled
            # (mode "reduce-overhead": CUDA graphs). The decode rate is the
            # difference between generating tg tokens and 1 token after the
            # same depth-token prompt, over tg-1 tokens.
            try:
                # generate() compiles the decoding forward itself when the
                # cache is static (transformers' auto-compile); compiling it
                # by hand as well made Inductor's CUDA graphs overwrite the
                # static cache's counters (2026-11-23).
                prompt = torch.randint(0, vocab, (1, a.depth), device="cuda")

                def gen(n):
                    return model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
                                          min_new_tokens=n, do_sample=False, cache_implementation="static",
                                          pad_token_id=0)
                t0 = time.perf_counter()
                for _ in range(3):  # compile and capture
                    gen(a.tg)
                    gen(1)
                warm = time.perf_counter() - t0
                tn = cuda_time(lambda: gen(a.tg), a.reps)
                t1 = cuda_time(lambda: gen(1), a.reps)
                out["tg_compiled"] = {"batch": 1, "depth": a.depth, "tokens": a.tg,
                                      "tokens_per_s": (a.tg - 1) / (tn - t1), "compile_and_warmup_s": warm,
                                      "compiled": hasattr(model, "_compiled_call") and model._compiled_call is not None}
            except Exception as e:  # report, never hide
                out["tg_compiled"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
