#!/usr/bin/env python3
"""Train kiln's built-in demo model: a ~5M-parameter Llama on the King James Bible.

kiln cannot ship a public model, so it ships its own: a byte-level BPE
tokenizer and a small Llama trained from scratch on the KJV text (public
domain). This script does everything, deterministically for a given --seed:

  1. parse the KJV text into 66 books and normalize it (see normalize_book);
  2. hold out whole books (HELDOUT) for evaluation, train on the rest;
  3. train a byte-level BPE tokenizer (HF tokenizers) on the training books;
  4. train a LlamaForCausalLM (transformers) in bf16 autocast with fp32
     master weights, AdamW and a cosine schedule; several schedule lengths
     (--steps a,b,c) are tried and the one with the lowest loss on a
     validation split carved out of the *training* books is exported (the
     held-out books are never used to choose anything);
  5. export config.json, model.safetensors (bf16), tokenizer.json,
     tokenizer_config.json, generation_config.json and MODEL_CARD.md;
  6. compute held-out perplexity from the exported checkpoint in float32 on
     the CPU (the exact definition kiln's `kiln perplexity` implements) and
     record reference greedy generations and logits for kiln's Go tests.

Input: --data DIR holding kjv.txt, the output of Debian's bible-kjv
(`bible -f "Gen1:1-Rev22:21"` with the bible-kjv-text data): one verse per
line, "Ge1:1 In the beginning God created ...".

Normalization (normalize_book): each book becomes one document; each chapter
starts with a heading line "<Book name> <chapter>" (e.g. "Genesis 1",
"1 Samuel 3", "Song of Solomon 2"), followed by the chapter's verses, one per
line, verse numbers dropped, runs of whitespace collapsed to one space,
leading/trailing spaces stripped. Every line ends with "\n" (so the document
ends with "\n"). The text is plain ASCII; nothing else is changed.

Output layout under --out:
  files/     the model directory (what kiln loads)
  testdata/  heldout/<Book>.txt, perplexity.json, reference.json,
             reference_logits.bin
  loss.tsv   the loss curve of every schedule tried
"""

import argparse
import json
import math
import os
import platform
import re
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import tokenizers  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

# (abbreviation in the bible-kjv dump, book name), in canonical order.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"), ("Jer", "Jeremiah"),
    ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"), ("Hos", "Hosea"),
    ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"), ("Jonah", "Jonah"),
    ("Mic", "Micah"), ("Nahum", "Nahum"), ("Hab", "Habakkuk"), ("Zep", "Zephaniah"),
    ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"), ("Mat", "Matthew"),
    ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"), ("Gal", "Galatians"),
    ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"), ("1Th", "1 Thessalonians"),
    ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"), ("2Tim", "2 Timothy"), ("Titus", "Titus"),
    ("Phmn", "Philemon"), ("Heb", "Hebrews"), ("Jas", "James"), ("1Pet", "1 Peter"),
    ("2Pet", "2 Peter"), ("1Jn", "1 John"), ("2Jn", "2 John"), ("3Jn", "3 John"),
    ("Jude", "Jude"), ("Rev", "Revelation"),
]

# Held-out books, varied in genre: OT narrative, wisdom, gospel, epistle.
HELDOUT = ["Ruth", "Ecclesiastes", "Mark", "Jude"]

BOS = "<|endoftext|>"
SPECIALS = [BOS, "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

PPL_WINDOW = 512
PPL_STRIDE = 256
PPL_DEFINITION = (
    "Held-out perplexity. Model: the exported bf16 checkpoint loaded with transformers "
    "AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32, attn_implementation='eager') "
    "on the CPU (bf16 weights upcast, float32 math). Text: each held-out book file's whole "
    "contents as is. ids = tokenizer.encode(text, add_special_tokens=False).ids (no BOS). "
    "Sliding window W=512, stride S=256 (the Hugging Face docs' loop): prev_end = 0; for begin "
    "in range(0, len(ids), S): end = min(begin + W, len(ids)); trg_len = end - prev_end; "
    "input = ids[begin:end]; labels = input.copy(); labels[:-trg_len] = -100; position j of "
    "input predicts label j+1 (the usual shift; the first token of the file is never "
    "predicted); n_predicted = number of shifted labels that are not -100; nll = sum over "
    "those positions of -log softmax(logits[j])[label j+1]; total_nll += nll; n_total += "
    "n_predicted; prev_end = end; stop once end == len(ids). ppl = exp(total_nll / n_total). "
    "Per book: n_tokens = len(ids), n_predicted = n_total, total_nll (float64), ppl; 'overall' "
    "pools total_nll and n_predicted over the books."
)


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------------------
# data

VERSE_RE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def parse_kjv(path):
    """Returns {book name: [(chapter, verse, text), ...]} in canonical order."""
    abbr2name = dict(BOOKS)
    books = {name: [] for _, name in BOOKS}
    n = 0
    with open(path, encoding="ascii") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip():
                continue
            m = VERSE_RE.match(line)
            if not m:
                raise ValueError(f"unparsed line: {line!r}")
            abbr, ch, vs, text = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
            if abbr not in abbr2name:
                raise ValueError(f"unknown book abbreviation {abbr!r}")
            books[abbr2name[abbr]].append((ch, vs, text))
            n += 1
    if n != 31102:
        raise ValueError(f"expected 31102 verses, got {n}")
    for name, verses in books.items():
        if not verses:
            raise ValueError(f"book {name} is empty")
    return books


def normalize_book(name, verses):
    """One document per book: "<Book> <chapter>" heading lines, one verse per line."""
    lines = []
    chapter = None
    for ch, _vs, text in verses:
        if ch != chapter:
            lines.append(f"{name} {ch}")
            chapter = ch
        text = " ".join(text.split())
        lines.append(text)
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts, vocab_size):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B:1",
        special_tokens=[(BOS, bos_id)],
    )
    return tok


# ---------------------------------------------------------------------------
# model helpers


def add_dropout_hooks(model, p):
    """Residual-branch dropout during training only (not part of the exported architecture)."""
    handles = []

    def hook(mod, inp, out):
        if not mod.training or p <= 0:
            return out
        if isinstance(out, tuple):
            return (F.dropout(out[0], p, True),) + tuple(out[1:])
        return F.dropout(out, p, True)

    handles.append(model.model.embed_tokens.register_forward_hook(hook))
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(hook))
        handles.append(layer.mlp.register_forward_hook(hook))
    return handles


def lm_loss(model, x, y):
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))


@torch.no_grad()
def eval_windows(model, windows, bs=64):
    """Mean next-token loss over a [N, L+1] tensor of windows."""
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, windows.size(0), bs):
        w = windows[i:i + bs]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=w[:, :-1]).logits
        nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1), reduction="sum")
        tot += nll.item()
        cnt += w[:, 1:].numel()
    model.train()
    return tot / cnt


def chop(ids, L):
    """Non-overlapping windows of L+1 tokens (consecutive windows share one token)."""
    n = (len(ids) - 1) // L
    return torch.stack([ids[i * L:i * L + L + 1] for i in range(n)]) if n > 0 else ids[None, : L + 1]


def lr_at(step, total, peak, warmup, min_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return peak * (min_frac + (1 - min_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train_one(args, cfg, steps, train_stream, starts, val_windows, test_windows, device, tag, curve):
    """Train one schedule of `steps` steps; returns (best state dict on CPU, info)."""
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(cfg).to(device)
    model.train()
    hooks = add_dropout_hooks(model, args.dropout)
    decay, no_decay = [], []
    for n_, p_ in model.named_parameters():
        (decay if p_.dim() >= 2 else no_decay).append(p_)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True,
    )
    g = torch.Generator(device="cpu")
    g.manual_seed(args.seed + 1)
    L, B = args.seq_len, args.batch
    bos = torch.full((B // 2, 1), cfg.bos_token_id, dtype=torch.long, device=device)
    ar = torch.arange(L + 1, device=device)
    best = (float("inf"), -1, None)
    t0 = time.time()
    info = {"steps": steps, "curve": []}
    for step in range(steps):
        lr = lr_at(step, steps, args.lr, args.warmup, args.min_lr_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        idx = torch.randint(len(starts), (B,), generator=g)
        s = starts[idx].to(device)
        win = train_stream[s[:, None] + ar[None, :]]  # [B, L+1]
        # half the batch starts with BOS (as kiln's prompts do), half is a raw slice of the stream
        win = torch.cat([torch.cat([bos, win[: B // 2, :L]], dim=1), win[B // 2:]], dim=0)
        x, y = win[:, :-1], win[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lm_loss(model, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        last = step == steps - 1
        if step % args.log_every == 0 or last:
            tl = loss.item()
            row = {"step": step, "train_loss": tl, "lr": lr, "grad_norm": gn.item(), "elapsed_s": time.time() - t0}
            if step % args.eval_every == 0 or last:
                vl = eval_windows(model, val_windows)
                hl = eval_windows(model, test_windows)
                row["val_loss"] = vl
                row["heldout_loss"] = hl
                if vl < best[0]:
                    best = (vl, step, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()})
            info["curve"].append(row)
            curve.write(f"{tag}\t{step}\t{tl:.4f}\t{row.get('val_loss', float('nan')):.4f}\t"
                        f"{row.get('heldout_loss', float('nan')):.4f}\t{lr:.6f}\t{row['elapsed_s']:.1f}\n")
            curve.flush()
            log(f"[{tag}] step {step:5d}  loss {tl:.4f}  lr {lr:.2e}  gnorm {gn.item():.2f}"
                + (f"  val {row['val_loss']:.4f}  heldout {row['heldout_loss']:.4f}" if "val_loss" in row else "")
                + f"  {row['elapsed_s']:.1f}s")
    torch.cuda.synchronize()
    info["train_time_s"] = time.time() - t0
    info["best_val_loss"], info["best_step"] = best[0], best[1]
    info["final_train_loss"] = info["curve"][-1]["train_loss"]
    for h in hooks:
        h.remove()
    return best[2], info


# ---------------------------------------------------------------------------
# evaluation on the exported checkpoint (CPU, float32)


def perplexity(model, ids):
    """The sliding-window definition in PPL_DEFINITION. Returns (n_predicted, total_nll)."""
    n_total, total_nll = 0, 0.0
    prev_end = 0
    for begin in range(0, len(ids), PPL_STRIDE):
        end = min(begin + PPL_WINDOW, len(ids))
        trg_len = end - prev_end
        inp = torch.tensor(ids[begin:end], dtype=torch.long)[None]
        labels = inp.clone()
        labels[:, :-trg_len] = -100
        with torch.no_grad():
            logits = model(input_ids=inp, use_cache=False).logits.float()
        shift_logits = logits[0, :-1]
        shift_labels = labels[0, 1:]
        mask = shift_labels != -100
        lp = torch.log_softmax(shift_logits[mask], dim=-1)
        nll = -lp.gather(1, shift_labels[mask][:, None]).squeeze(1)
        total_nll += float(nll.double().sum().item())
        n_total += int(mask.sum().item())
        prev_end = end
        if end == len(ids):
            break
    return n_total, total_nll


@torch.no_grad()
def greedy(model, ids, n):
    out = list(ids)
    for _ in range(n):
        logits = model(input_ids=torch.tensor(out, dtype=torch.long)[None], use_cache=False).logits[0, -1].float()
        out.append(int(torch.argmax(logits).item()))
    return out[len(ids):]


@torch.no_grad()
def sample(model, ids, n, temperature, top_p, seed, stop_id=None):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    out = list(ids)
    for _ in range(n):
        logits = model(input_ids=torch.tensor(out[-PPL_WINDOW:], dtype=torch.long)[None], use_cache=False).logits[0, -1].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < top_p
        sp = sp * keep
        nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=g)].item())
        if stop_id is not None and nxt == stop_id:
            break
        out.append(nxt)
    return out[len(ids):]


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="folder holding kjv.txt")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--steps", default="1500", help="comma-separated schedule lengths to try; the best on validation is exported")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=640)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-block", type=int, default=4096, help="validation: every --val-every-th block of this many training tokens")
    ap.add_argument("--val-every", type=int, default=25)
    ap.add_argument("--threads", type=int, default=16, help="CPU threads for the float32 evaluation")
    args = ap.parse_args()
    t_start = time.time()
    command = "python3 tools/demo-model/train.py " + " ".join(sys.argv[1:])

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev_name = torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor()
    versions = {
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__, "numpy": np.__version__,
    }
    log("versions", json.dumps(versions), "device", dev_name)
    log("command", command)

    out = args.out
    files_dir = os.path.join(out, "files")
    td_dir = os.path.join(out, "testdata")
    os.makedirs(files_dir, exist_ok=True)
    os.makedirs(os.path.join(td_dir, "heldout"), exist_ok=True)

    # 1. data
    books = parse_kjv(os.path.join(args.data, "kjv.txt"))
    docs = {name: normalize_book(name, verses) for name, verses in books.items()}
    for h in HELDOUT:
        assert h in docs, h
    train_names = [name for _, name in BOOKS if name not in HELDOUT]
    total_chars = sum(len(d) for d in docs.values())
    held_chars = sum(len(docs[h]) for h in HELDOUT)
    log(f"books {len(docs)}, chars {total_chars}, held out {HELDOUT}: {held_chars} chars ({100 * held_chars / total_chars:.2f}%)")
    for h in HELDOUT:
        with open(os.path.join(td_dir, "heldout", h.replace(" ", "_") + ".txt"), "w", encoding="ascii", newline="\n") as f:
            f.write(docs[h])

    # 2. tokenizer (trained on the training books only)
    tok = train_tokenizer([docs[n] for n in train_names], args.vocab)
    V = tok.get_vocab_size()
    bos_id = tok.token_to_id(BOS)
    log(f"tokenizer: vocab {V}, specials {[(s, tok.token_to_id(s)) for s in SPECIALS]}")
    tok.save(os.path.join(files_dir, "tokenizer.json"))
    tok = Tokenizer.from_file(os.path.join(files_dir, "tokenizer.json"))
    probe = "In the beginning God created the heaven and the earth."
    enc = tok.encode(probe)
    assert enc.ids[0] == bos_id, enc.ids
    assert tok.decode(enc.ids, skip_special_tokens=True) == probe
    log(f"probe ids {enc.ids} tokens {enc.tokens}")

    stream = []
    for n in train_names:
        stream.append(bos_id)
        stream.extend(tok.encode(docs[n], add_special_tokens=False).ids)
    stream = torch.tensor(stream, dtype=torch.long)
    held_ids = {h: tok.encode(docs[h], add_special_tokens=False).ids for h in HELDOUT}
    train_chars = sum(len(docs[n]) for n in train_names)
    log(f"train tokens {len(stream)} ({train_chars / len(stream):.2f} chars/token); held-out tokens "
        + ", ".join(f"{h} {len(v)}" for h, v in held_ids.items()))

    # validation split carved from the training stream: every val_every-th block of val_block tokens
    L = args.seq_len
    nblocks = (len(stream) + args.val_block - 1) // args.val_block
    is_val = np.zeros(len(stream), dtype=bool)
    val_parts = []
    for b in range(args.val_every // 2, nblocks, args.val_every):
        a, e = b * args.val_block, min((b + 1) * args.val_block, len(stream))
        is_val[a:e] = True
        val_parts.append(stream[a:e])
    # training windows [s, s+L] (L+1 tokens) must not touch a validation token
    bad = np.concatenate([is_val, np.ones(L + 1, dtype=bool)]).astype(np.int64)
    cs = np.concatenate([[0], np.cumsum(bad)])
    s_all = np.arange(len(stream))
    ok = (cs[s_all + L + 1] - cs[s_all]) == 0
    starts = torch.from_numpy(s_all[ok].copy())
    val_windows = torch.cat([chop(p, L) for p in val_parts if len(p) > L]).to(device)
    test_windows = torch.cat([chop(torch.tensor(v), L) for v in held_ids.values()]).to(device)
    val_tokens = int(is_val.sum())
    log(f"validation tokens {val_tokens} ({len(val_parts)} blocks, {val_windows.size(0)} windows); "
        f"training start positions {len(starts)}; heldout eval windows {test_windows.size(0)}")
    train_stream = stream.to(device)

    # 3. model + training
    cfg = LlamaConfig(
        vocab_size=V, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads, max_position_embeddings=512, rope_theta=10000.0,
        rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=bos_id, eos_token_id=bos_id,
        hidden_act="silu", attention_bias=False, mlp_bias=False, initializer_range=0.02,
        attention_dropout=0.0, use_cache=True,
    )
    cfg._attn_implementation = "eager"
    probe_model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in probe_model.parameters())
    log(f"attention implementation: {probe_model.config._attn_implementation}")
    del probe_model
    log(f"model: {n_params} parameters (tied embeddings counted once)")

    schedules = [int(s) for s in args.steps.split(",") if s]
    curve = open(os.path.join(out, "loss.tsv"), "w")
    curve.write("schedule\tstep\ttrain_loss\tval_loss\theldout_loss\tlr\telapsed_s\n")
    results = []
    for steps in schedules:
        state, info = train_one(args, cfg, steps, train_stream, starts, val_windows, test_windows, device,
                                f"steps={steps}", curve)
        log(f"[steps={steps}] done in {info['train_time_s']:.1f}s; best val {info['best_val_loss']:.4f} at step {info['best_step']}")
        results.append((info["best_val_loss"], steps, state, info))
    curve.close()
    chosen = min(results, key=lambda r: r[0])
    _, chosen_steps, state, chosen_info = chosen
    log(f"chosen schedule: steps={chosen_steps}, checkpoint at step {chosen_info['best_step']} (val {chosen_info['best_val_loss']:.4f})")

    # 4. export
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(state)
    model = model.to(torch.bfloat16)
    model.config.use_cache = True
    model.save_pretrained(files_dir, safe_serialization=True)
    with open(os.path.join(files_dir, "config.json")) as f:
        cj = json.load(f)
    cj["torch_dtype"] = "bfloat16"
    cj["dtype"] = "bfloat16"
    cj.setdefault("rope_theta", 10000.0)
    cj["bos_token_id"] = bos_id
    cj["eos_token_id"] = bos_id
    cj.pop("_attn_implementation", None)
    with open(os.path.join(files_dir, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    gen = {"bos_token_id": bos_id, "eos_token_id": bos_id, "do_sample": True, "temperature": 0.8, "top_p": 0.95,
           "max_length": 512}
    with open(os.path.join(files_dir, "generation_config.json"), "w") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS, "eos_token": BOS, "pad_token": BOS,
        "model_max_length": 512, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(files_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tcfg, f, indent=2)
        f.write("\n")
    del model

    # 5. evaluation on the exported checkpoint: float32 math on the CPU
    torch.set_num_threads(args.threads)
    m32 = AutoModelForCausalLM.from_pretrained(files_dir, dtype=torch.float32, attn_implementation="eager")
    m32.eval()
    m32 = m32.to("cpu")
    assert next(m32.parameters()).dtype == torch.float32
    etok = Tokenizer.from_file(os.path.join(files_dir, "tokenizer.json"))
    ppl = {"definition": PPL_DEFINITION, "window": PPL_WINDOW, "stride": PPL_STRIDE, "books": {}}
    all_n, all_nll = 0, 0.0
    for h in HELDOUT:
        fn = h.replace(" ", "_") + ".txt"
        with open(os.path.join(td_dir, "heldout", fn), encoding="ascii", newline="") as f:
            text = f.read()
        ids = etok.encode(text, add_special_tokens=False).ids
        n_pred, nll = perplexity(m32, ids)
        ppl["books"][h] = {"file": "heldout/" + fn, "n_tokens": len(ids), "n_predicted": n_pred,
                           "total_nll": nll, "ppl": math.exp(nll / n_pred)}
        all_n += n_pred
        all_nll += nll
        log(f"heldout {h}: tokens {len(ids)}, predicted {n_pred}, nll {nll:.6f}, ppl {math.exp(nll / n_pred):.4f}")
    ppl["overall"] = {"n_predicted": all_n, "total_nll": all_nll, "ppl": math.exp(all_nll / all_n)}
    log(f"heldout overall ppl {ppl['overall']['ppl']:.4f}")
    ppl["transformers"] = transformers.__version__
    ppl["torch"] = torch.__version__
    with open(os.path.join(td_dir, "perplexity.json"), "w") as f:
        json.dump(ppl, f, indent=2)
        f.write("\n")

    # reference greedy generations and logits
    prompts = ["In the beginning", "And the LORD said unto Moses", "Blessed are the"]
    ref = {"prompts": [], "logits_prompt": 0, "transformers": transformers.__version__, "torch": torch.__version__,
           "dtype": "float32 math on CPU, bf16 weights upcast", "max_new_tokens": 48,
           "note": "greedy: argmax of the last position's float32 logits, full recompute each step, no EOS stop"}
    for p in prompts:
        ids = etok.encode(p, add_special_tokens=True).ids
        new = greedy(m32, ids, 48)
        txt = etok.decode(new, skip_special_tokens=False)
        ref["prompts"].append({"text": p, "input_ids": ids, "greedy_ids": new, "greedy_text": txt})
        log(f"greedy {p!r} -> {txt!r}")
        try:  # cross-check with transformers' generate (KV cache); informational
            from transformers import GenerationConfig
            gc = GenerationConfig(do_sample=False, max_new_tokens=48, eos_token_id=None, pad_token_id=bos_id)
            m32.generation_config = GenerationConfig()
            go = m32.generate(torch.tensor([ids]), generation_config=gc, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
            log(f"  generate() agrees: {go[0, len(ids):].tolist() == new}")
        except Exception as e:  # noqa: BLE001
            log(f"  generate() cross-check failed: {e!r}")
    ids0 = ref["prompts"][0]["input_ids"]
    with torch.no_grad():
        lg = m32(input_ids=torch.tensor([ids0]), use_cache=False).logits[0].float().numpy()
    ref["logits_shape"] = list(lg.shape)
    lg.astype("<f4").tofile(os.path.join(td_dir, "reference_logits.bin"))
    with open(os.path.join(td_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=2)
        f.write("\n")

    # samples for the model card
    samples = []
    for i, p in enumerate(["In the beginning", "In the beginning", "And Jesus said unto them"]):
        ids = etok.encode(p, add_special_tokens=True).ids
        s = sample(m32, ids, 120, 0.8, 0.95, seed=args.seed + i, stop_id=bos_id)
        txt = p + etok.decode(s)
        samples.append({"prompt": p, "seed": args.seed + i, "text": txt})
        log(f"sample (T=0.8, top_p=0.95, seed {args.seed + i}):\n{txt}\n")

    # tokenizer_config sanity check through transformers (informational)
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(files_dir)
        chat = at.apply_chat_template([{"role": "user", "content": "Who made the heaven?"}], tokenize=False,
                                      add_generation_prompt=True)
        log(f"AutoTokenizer ok: {type(at).__name__}; chat template renders {chat!r}; "
            f"encode bos: {at('In the beginning')['input_ids'][:3]}")
    except Exception as e:  # noqa: BLE001
        log(f"AutoTokenizer check failed: {e!r}")

    # 6. model card
    st_bytes = os.path.getsize(os.path.join(files_dir, "model.safetensors"))
    tj_bytes = os.path.getsize(os.path.join(files_dir, "tokenizer.json"))
    total_time = time.time() - t_start
    write_card(os.path.join(files_dir, "MODEL_CARD.md"), args=args, command=command, versions=versions,
               dev_name=dev_name, cfg=cj, n_params=n_params, st_bytes=st_bytes, tj_bytes=tj_bytes,
               total_chars=total_chars, held_chars=held_chars, train_tokens=len(stream), val_tokens=val_tokens,
               held_ids=held_ids, results=results, chosen=chosen, ppl=ppl, ref=ref, samples=samples,
               total_time=total_time, V=V)
    summary = {"n_params": n_params, "model_safetensors_bytes": st_bytes, "tokenizer_json_bytes": tj_bytes,
               "chosen_steps": chosen_steps, "best_step": chosen_info["best_step"],
               "best_val_loss": chosen_info["best_val_loss"], "schedules": [r[3] for r in results],
               "perplexity": ppl["overall"], "total_time_s": total_time, "versions": versions, "device": dev_name}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    log(f"all done in {total_time:.1f}s")


def write_card(path, *, args, command, versions, dev_name, cfg, n_params, st_bytes, tj_bytes, total_chars,
               held_chars, train_tokens, val_tokens, held_ids, results, chosen, ppl, ref, samples, total_time, V):
    _, chosen_steps, _, info = chosen
    rows = [r for r in info["curve"] if "val_loss" in r]
    if len(rows) > 20:
        k = math.ceil(len(rows) / 20)
        rows = rows[::k] + ([rows[-1]] if rows[-1] is not rows[::k][-1] else [])
    lines = []
    w = lines.append
    w("# kiln demo model: a small Llama trained on the King James Bible\n")
    w("kiln's built-in demo model, trained from scratch by `tools/demo-model/train.py` so that "
      "`kiln run` works offline with no download. It writes readable KJV-style English; it knows "
      "nothing but the King James Bible and is not an assistant.\n")
    w("## Data\n")
    w("The King James Version (1611) as shipped by Debian's `bible-kjv-text` package (read with "
      "`bible -f \"Gen1:1-Rev22:21\"` from the `bible-kjv` package: 31,102 verses, 66 books). "
      "**License: the KJV text is in the public domain**; this model, its tokenizer and the held-out "
      "text files are derived from it only.\n")
    w("Normalization: each book is one document. Each chapter starts with a heading line "
      "`<Book name> <chapter>` (e.g. `Genesis 1`, `Song of Solomon 2`), followed by the chapter's "
      "verses one per line; verse numbers and references are dropped, runs of whitespace become one "
      "space, lines are stripped, every line ends with `\\n`. Nothing else is changed (the text is ASCII).\n")
    w(f"Held-out books (never trained on, never used to choose anything): {', '.join(HELDOUT)} "
      f"({held_chars:,} of {total_chars:,} characters, {100 * held_chars / total_chars:.2f}%). "
      f"Training: the other {66 - len(HELDOUT)} books, {train_tokens:,} tokens, of which "
      f"{val_tokens:,} tokens (every {args.val_every}th block of {args.val_block}) are a validation "
      f"split used to choose the schedule and checkpoint, and are not trained on.\n")
    w("## Tokenizer\n")
    w(f"Byte-level BPE (Hugging Face `tokenizers`), trained on the training books: vocabulary {V} "
      "including the special tokens `<|endoftext|>` (id 0: BOS, EOS and document separator), "
      "`<|user|>`, `<|assistant|>`, `<|system|>`, `<|end|>` (ids 1-4, for the chat template; the model "
      "was not trained on chat). GPT-2 style ByteLevel pre-tokenizer (add_prefix_space false), ByteLevel "
      "decoder, a TemplateProcessing post-processor that prepends `<|endoftext|>` when special tokens "
      f"are added. The held-out books are {sum(len(v) for v in held_ids.values()):,} tokens.\n")
    w("## Architecture and size\n")
    w(f"LlamaForCausalLM: hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
      f"{cfg['num_attention_heads']} heads of {cfg['head_dim']}, {cfg['num_key_value_heads']} KV heads (GQA), "
      f"SwiGLU intermediate {cfg['intermediate_size']}, RMSNorm eps {cfg['rms_norm_eps']}, RoPE theta 10000, "
      f"max positions {cfg['max_position_embeddings']}, tied input/output embeddings, vocabulary {V}.\n")
    w(f"Parameters: {n_params:,}. model.safetensors (bf16): {st_bytes:,} bytes; tokenizer.json: {tj_bytes:,} bytes.\n")
    w("## Training\n")
    sched = ", ".join(f"{r[1]} steps (best validation loss {r[0]:.4f} at step {r[3]['best_step']}, "
                      f"{r[3]['train_time_s']:.0f} s)" for r in results)
    w(f"AdamW (betas 0.9/0.95, weight decay {args.weight_decay} on matrices), peak lr {args.lr}, "
      f"{args.warmup} warm-up steps then cosine decay to {args.min_lr_frac}x, gradient clipping "
      f"{args.clip}, bf16 autocast with fp32 master weights, eager attention. Batch {args.batch} "
      f"sequences of {args.seq_len} tokens ({args.batch * args.seq_len:,} tokens per step), drawn at "
      "random positions of the training stream (books concatenated, each preceded by `<|endoftext|>`); "
      "half of each batch has `<|endoftext|>` put in front, as kiln's prompts do. Dropout "
      f"{args.dropout} on the embedding, attention and MLP outputs during training only (forward "
      "hooks; not part of the exported architecture).\n")
    w(f"Schedules tried: {sched}. Exported: the {chosen_steps}-step schedule's checkpoint at step "
      f"{info['best_step']} (validation loss {info['best_val_loss']:.4f}). Device: {dev_name}. "
      f"Whole script wall time {total_time:.0f} s.\n")
    w(f"Loss curve of the exported schedule (train loss is one batch with dropout; validation and "
      f"held-out losses in nats/token, bf16 autocast on the GPU):\n")
    w("| step | lr | train loss | validation loss | held-out loss |")
    w("|---:|---:|---:|---:|---:|")
    for r in rows:
        w(f"| {r['step']} | {r['lr']:.2e} | {r['train_loss']:.4f} | {r['val_loss']:.4f} | {r['heldout_loss']:.4f} |")
    w("\nThe full curves of every schedule are in tools/demo-model/loss.tsv and train.log.\n")
    w("## Held-out perplexity\n")
    w("From the exported checkpoint, in float32 on the CPU, sliding window 512 with stride 256 "
      "(the definition is spelled out in demo/testdata/perplexity.json; `kiln perplexity` implements the same):\n")
    w("| book | tokens | predicted | perplexity |")
    w("|---|---:|---:|---:|")
    for h, b in ppl["books"].items():
        w(f"| {h} | {b['n_tokens']:,} | {b['n_predicted']:,} | {b['ppl']:.3f} |")
    w(f"| overall | {sum(b['n_tokens'] for b in ppl['books'].values()):,} | {ppl['overall']['n_predicted']:,} | {ppl['overall']['ppl']:.3f} |\n")
    w("## Samples\n")
    w("Greedy (float32, CPU, 48 new tokens; demo/testdata/reference.json):\n")
    for p in ref["prompts"]:
        w(f"- `{p['text']}` → {json.dumps(p['greedy_text'])}")
    w("\nSampled (temperature 0.8, top-p 0.95, up to 120 tokens):\n")
    for s in samples:
        w(f"seed {s['seed']}:\n\n```\n{s['text']}\n```\n")
    w("## Reproduce\n")
    w(f"```\n{command}\n```\n")
    w(f"Seed {args.seed}. Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ". "
      "Determinism: torch.manual_seed, a seeded generator for the data order, "
      "torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8, TF32 off.\n")
    with open(path, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    main()
