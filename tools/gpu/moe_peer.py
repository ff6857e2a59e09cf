"""The PyTorch/transformers peer of `kiln bench model --random moe-7b-a1b` on
the GPU machine: transformers' Mixtral of the same shape (64 experts of
1024, 8 a token, hidden 2048, 16 layers, vocabulary 50304) with random bf16
weights, decode tokens/s of `batch` sequences holding `depth` tokens
(greedy, DynamicCache, eager), and prefill tokens/s of one pp-token prompt;
median of reps after a warm-up, one JSON object.

    python3 tools/gpu/moe_peer.py [--depth 512] [--tg 32] [--batch 1,64] [--pp 512]
"""
import argparse
import json
import statistics
import time

import torch
from transformers import DynamicCache, MixtralConfig, MixtralForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--tg", type=int, default=32)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--batch", default="1,64")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    import transformers
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "transformers": transformers.__version__}
    cfg = MixtralConfig(hidden_size=2048, intermediate_size=1024, num_hidden_layers=16, num_attention_heads=16,
                        num_key_value_heads=16, vocab_size=50304, max_position_embeddings=4096, num_local_experts=64,
                        num_experts_per_tok=8, sliding_window=None)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = MixtralForCausalLM(cfg).to(torch.bfloat16).eval()
    for p in model.parameters():
        p.data.normal_(0, 0.02)
    out["params"] = sum(p.numel() for p in model.parameters())
    vocab = cfg.vocab_size

    def timed(fn):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    with torch.inference_mode():
        if a.pp > 0:
            ids = torch.randint(0, vocab, (1, a.pp), device="cuda")
            ts = [timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1)) for _ in range(a.reps + 1)][1:]
            out["pp"] = {"tokens": a.pp, "tokens_per_s": a.pp / statistics.median(ts)}
        out["tg"] = []
        for batch in [int(b) for b in a.batch.split(",")]:
            prompt = torch.randint(0, vocab, (batch, a.depth), device="cuda")
            times = []
            for rep in range(a.reps + 1):
                cache = DynamicCache()
                o = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
                tok = o.logits[:, -1].argmax(-1, keepdim=True)

                def steps():
                    nonlocal o, tok
                    for _ in range(a.tg):
                        o = model(input_ids=tok, past_key_values=cache, use_cache=True)
                        tok = o.logits[:, -1].argmax(-1, keepdim=True)

                t = timed(steps)
                if rep > 0:
                    times.append(t)
            out["tg"].append({"batch": batch, "depth": a.depth, "tokens_per_s": batch * a.tg / statistics.median(times)})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
