#!/usr/bin/python3
"""Trains kiln's default model: a small Llama with one DeepSeek-style MTP head, on the Brown Corpus.

  train.py --corpus corpus/ --tokenizer model/ --out model/ [--minutes 55] [--seed 0]

Reads train.txt and heldout.txt (prepare_corpus.py) and the tokenizer (train_tokenizer.py),
trains with Debian's python3-torch on the CPU (matrix products in bf16 under autocast, fp32
master weights and optimizer state), and writes into --out: model.safetensors (bf16),
config.json and training.json (every setting, the loss curve, the held-out perplexity, the
time). Deterministic for a seed, a step count and a thread count: --minutes only picks the step
count when --steps is not given, and training.json records the steps run. The held-out
perplexity is that of the written bf16 weights, evaluated in fp32 (evaluate.py computes the
same number for any slice of text).

The MTP head is trained as DeepSeek-V3 trains it: at position i it reads the main model's
final-normed hidden state h_i and the embedding of token i+1 (zero at position 0, as kiln runs
DeepSeek-layout heads), and predicts token i+2; its loss is weighted by --mtp-weight. Tensor names follow `kiln synth --mtp_layers 1` (the head is
model.layers.{num_hidden_layers}.*, sharing the embedding and the LM head).
"""
import argparse
import json
import math
import os
import platform
import struct
import sys
import time

import regex
import torch
import torch.nn.functional as F
from torch import nn

from train_tokenizer import GPT2_SPLIT, byte_to_unicode


class Tokenizer:
    """Encodes with the merges of tokenizer.json (BPE ranks), a cache per pre-token."""

    def __init__(self, directory):
        with open(os.path.join(directory, "tokenizer.json"), encoding="utf-8") as f:
            data = json.load(f)
        self.vocab = data["model"]["vocab"]
        self.ranks = {tuple(m.split(" ")): i for i, m in enumerate(data["model"]["merges"])}
        self.specials = {t["content"]: t["id"] for t in data["added_tokens"]}
        self.size = max(list(self.vocab.values()) + list(self.specials.values())) + 1
        self.eos = self.specials["<|endoftext|>"]
        self.chars = byte_to_unicode()
        self.cache = {}

    def _word(self, word):
        parts = [self.chars[b] for b in word.encode("utf-8")]
        while len(parts) > 1:
            ranked = [(self.ranks.get((a, b), math.inf), i)
                      for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            rank, i = min(ranked)
            if rank == math.inf:
                break
            parts[i:i + 2] = [parts[i] + parts[i + 1]]
        return [self.vocab[p] for p in parts]

    def encode(self, text):
        ids = []
        for word in regex.findall(GPT2_SPLIT, text):
            if word not in self.cache:
                self.cache[word] = self._word(word)
            ids.extend(self.cache[word])
        return ids

    def encode_documents(self, text):
        ids = []
        for document in text.split("\n\n"):
            if document.strip():
                ids.extend(self.encode(document.strip()))
                ids.append(self.eos)
        return ids


class RmsNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Block(nn.Module):
    """A Llama decoder layer (the names Hugging Face's LlamaDecoderLayer gives its weights)."""

    def __init__(self, c):
        super().__init__()
        h, hd = c["hidden_size"], c["head_dim"]
        self.heads, self.kv_heads, self.head_dim = (c["num_attention_heads"],
                                                    c["num_key_value_heads"], hd)
        self.input_layernorm = RmsNorm(h, c["rms_norm_eps"])
        self.post_attention_layernorm = RmsNorm(h, c["rms_norm_eps"])
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * hd, h, bias=False)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.mlp.up_proj = nn.Linear(h, c["intermediate_size"], bias=False)
        self.mlp.down_proj = nn.Linear(c["intermediate_size"], h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, _ = x.shape
        a = self.self_attn
        y = self.input_layernorm(x)
        q = a.q_proj(y).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = a.k_proj(y).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = a.v_proj(y).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        # Scaling q (not the t x t scores) and adding the mask in place spare passes over the
        # largest tensor of the step.
        scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-1, -2)
        scores += mask
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
        x = x + a.o_proj(y)
        y = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(y)) * self.mlp.up_proj(y))


class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        h = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RmsNorm(h, c["rms_norm_eps"])
        # The MTP head (model.layers.{L}.* in the checkpoint).
        self.mtp = Block(c)
        self.mtp.enorm = RmsNorm(h, c["rms_norm_eps"])
        self.mtp.hnorm = RmsNorm(h, c["rms_norm_eps"])
        self.mtp.eh_proj = nn.Linear(2 * h, h, bias=False)
        self.mtp.shared_head = nn.Module()
        self.mtp.shared_head.norm = RmsNorm(h, c["rms_norm_eps"])
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        # Residual projections scaled down with depth (GPT-2's initialisation).
        for block in list(self.layers) + [self.mtp]:
            for w in (block.self_attn.o_proj.weight, block.mlp.down_proj.weight):
                nn.init.normal_(w, std=0.02 / math.sqrt(2 * (c["num_hidden_layers"] + 1)))

    def rope_tables(self, t):
        hd = self.c["head_dim"]
        inv = 1.0 / (self.c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(t, dtype=torch.float32), inv)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()

    def forward(self, ids):
        """Main logits at every position and MTP logits at positions 0..T-2 (for tokens i+2)."""
        t = ids.shape[1]
        cos, sin = self.rope_tables(t)
        mask = torch.full((t, t), float("-inf")).triu(1)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        hidden = self.norm(x)
        logits = hidden @ self.embed_tokens.weight.t()  # tied LM head
        m = self.mtp
        # e = 0 at position 0, as kiln (and vLLM) run DeepSeek-layout heads (docs/mtp.md).
        keep = torch.ones(t - 1, 1)
        keep[0] = 0
        e = self.embed_tokens(ids[:, 1:]) * keep
        y = m.eh_proj(torch.cat((m.enorm(e), m.hnorm(hidden[:, :-1])), dim=-1))
        y = m(y, cos[:-1], sin[:-1], mask[:-1, :-1])
        mtp_logits = m.shared_head.norm(y) @ self.embed_tokens.weight.t()
        return logits, mtp_logits


def losses(model, batch):
    logits, mtp_logits = model(batch[:, :-1])
    main = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    mtp = F.cross_entropy(mtp_logits.reshape(-1, mtp_logits.shape[-1]), batch[:, 2:].reshape(-1))
    return main, mtp


@torch.no_grad()
def evaluate(model, stream, context, max_windows=None):
    """Per-token perplexity of the main model and the MTP head's over non-overlapping windows."""
    model.eval()
    total, mtp_total, count, mtp_count = 0.0, 0.0, 0, 0
    windows = range(0, len(stream) - context - 1, context)
    for n, start in enumerate(windows):
        if max_windows is not None and n >= max_windows:
            break
        batch = torch.tensor(stream[start:start + context + 1]).unsqueeze(0)
        main, mtp = losses(model, batch)
        total += main.item() * context
        count += context
        mtp_total += mtp.item() * (context - 1)
        mtp_count += context - 1
    model.train()
    return math.exp(total / count), math.exp(mtp_total / mtp_count)


def state_dict_for_kiln(model):
    """The Hugging Face names `kiln synth --mtp_layers 1` writes (embedding and head shared)."""
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight}
    layers = model.c["num_hidden_layers"]
    for prefix, block in [(f"model.layers.{i}.", b) for i, b in enumerate(model.layers)] + \
            [(f"model.layers.{layers}.", model.mtp)]:
        for name, tensor in block.named_parameters():
            out[prefix + name] = tensor
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to(torch.bfloat16).contiguous().view(torch.int16).numpy()
        raw = data.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for raw in blobs:
            f.write(raw)


JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def reexec_with_jemalloc():
    """Runs the script again under jemalloc with page purging off, when it is installed.

    glibc hands every large tensor (the t x t attention scores, the logits) back to the kernel
    when it is freed, so each step faults them in again: here that was 40 % of a step's time
    in the kernel. jemalloc keeping its pages makes a step 3-4x faster.
    """
    if os.environ.get("KILN_TRAIN_ALLOCATOR") or not os.path.exists(JEMALLOC):
        return
    env = dict(os.environ, KILN_TRAIN_ALLOCATOR="jemalloc",
               LD_PRELOAD=JEMALLOC, MALLOC_CONF="dirty_decay_ms:-1,muzzy_decay_ms:-1")
    os.execve(sys.executable, [sys.executable] + sys.argv, env)


def read_safetensors(path):
    """name -> fp32 tensor, for the files write_safetensors writes (BF16 only)."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
        data = f.read()
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "BF16":
            raise ValueError(f"{path}: {name} is {entry['dtype']}, not BF16")
        begin, end = entry["data_offsets"]
        raw = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.int16)
        out[name] = raw.view(torch.bfloat16).to(torch.float32).reshape(entry["shape"])
    return out


@torch.no_grad()
def load_kiln_state(model, tensors):
    """The inverse of state_dict_for_kiln: every parameter must be present."""
    names = state_dict_for_kiln(model)
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise ValueError(f"checkpoint lacks {missing}")
    for name, parameter in names.items():
        parameter.copy_(tensors[name])


def machine_description():
    model = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{model}, {os.cpu_count()} CPUs"


def main():
    reexec_with_jemalloc()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=1024)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--eval-every", type=int, default=100,
                        help="steps between held-out checks on --eval-windows windows")
    parser.add_argument("--eval-windows", type=int, default=8)
    parser.add_argument("--mtp-weight", type=float, default=0.3)
    parser.add_argument("--steps", type=int, default=0, help="0: as many as --minutes allow")
    parser.add_argument("--minutes", type=float, default=55)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    tokenizer = Tokenizer(args.tokenizer)
    with open(os.path.join(args.corpus, "train.txt"), encoding="utf-8") as f:
        train = tokenizer.encode_documents(f.read())
    with open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8") as f:
        heldout = tokenizer.encode_documents(f.read())
    print(f"train {len(train)} tokens, held out {len(heldout)}")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
        "hidden_act": "silu", "hidden_size": args.hidden, "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "head_dim": args.hidden // args.heads,
        "max_position_embeddings": args.context, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "rope_scaling": None, "tie_word_embeddings": True, "vocab_size": tokenizer.size,
        "num_nextn_predict_layers": 1, "bos_token_id": tokenizer.eos, "eos_token_id": tokenizer.eos,
        "torch_dtype": "bfloat16",
    }
    model = Model(config)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{parameters} parameters")
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95),
                                  weight_decay=0.1)
    data = torch.tensor(train)
    generator = torch.Generator().manual_seed(args.seed)

    def batch():
        starts = torch.randint(0, len(data) - args.context - 2, (args.batch,), generator=generator)
        return torch.stack([data[s:s + args.context + 1] for s in starts])

    # Steps from the time budget, measured on the first steps (then fixed: the run is
    # reproducible with --steps).
    steps = args.steps
    start = time.time()
    log = []
    step = 0
    while True:
        if steps and step >= steps:
            break
        if not steps and step == 5:
            per_step = (time.time() - start) / 5
            steps = max(6, int(args.minutes * 60 / per_step))
            print(f"{per_step:.2f} s per step: {steps} steps")
        total = steps or 10**9
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * \
            0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))
        for group in optimizer.param_groups:
            group["lr"] = max(lr, args.lr * 0.02)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            main, mtp = losses(model, batch())
            loss = main + args.mtp_weight * mtp
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step % 25 == 0:
            entry = {"step": step, "loss": round(main.item(), 4),
                     "mtp_loss": round(mtp.item(), 4), "lr": round(lr, 6),
                     "seconds": round(time.time() - start, 1)}
            if step % args.eval_every == 0 or step + 1 == steps:
                # A fixed slice of the held-out text: enough to see overfitting set in.
                entry["heldout_ppl"], entry["heldout_mtp_ppl"] = (
                    round(v, 3) for v in evaluate(model, heldout, args.context, args.eval_windows))
            log.append(entry)
            print(entry, flush=True)
        step += 1
    seconds = time.time() - start

    os.makedirs(args.out, exist_ok=True)
    weights = os.path.join(args.out, "model.safetensors")
    write_safetensors(weights, state_dict_for_kiln(model))
    # What is evaluated is what was written: the bf16 weights, computed in fp32.
    load_kiln_state(model, read_safetensors(weights))
    perplexity, mtp_perplexity = evaluate(model, heldout, args.context)
    print(f"held-out perplexity {perplexity:.3f} (MTP head, token t+2: {mtp_perplexity:.3f})")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(args.out, "training.json"), "w") as f:
        json.dump({"settings": vars(args), "steps": step, "parameters": parameters,
                   "train_tokens": len(train), "heldout_tokens": len(heldout),
                   "tokens_seen": step * args.batch * args.context,
                   "epochs": round(step * args.batch * args.context / len(train), 2),
                   "train_seconds": round(seconds, 1),
                   "heldout_perplexity": perplexity, "heldout_mtp_perplexity": mtp_perplexity,
                   "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "allocator": os.environ.get("KILN_TRAIN_ALLOCATOR", "glibc"),
                   "machine": machine_description(), "log": log}, f, indent=1)


if __name__ == "__main__":
    main()
