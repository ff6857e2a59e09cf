"""The PyTorch/transformers peer of `kiln bench model --random moe-7b-a1b` on
the GPU machine: transformers' Mixtral of the same shape (64 experts of
1024, 8 a token, hidden 2048, 16 layers, vocabulary 50304) with random bf16
weights, decode tokens/s of `batch` sequences holding `depth` tokens
(greedy, DynamicCache, eager), and prefill tokens/s of one pp-token prompt;
median of reps after a warm-up (torch_peer.py's measures), one JSON object.

    python3 tools/gpu/moe_peer.py [--depth 512] [--tg 32] [--batch 1,64] [--pp 512]
"""
import argparse
import json

import torch
from transformers import MixtralConfig, MixtralForCausalLM

from torch_peer import decode_rate, prefill_rate, random_model


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
    model = random_model(MixtralForCausalLM, cfg)
    out["params"] = sum(p.numel() for p in model.parameters())
    vocab = cfg.vocab_size
    with torch.inference_mode():
        if a.pp > 0:
            out["pp"] = {"tokens": a.pp, "tokens_per_s": prefill_rate(model, vocab, a.pp, a.reps)}
        out["tg"] = [{"batch": b, "depth": a.depth, "tokens_per_s": decode_rate(model, vocab, b, a.depth, a.tg, a.reps)}
                     for b in [int(x) for x in a.batch.split(",") if x]]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
