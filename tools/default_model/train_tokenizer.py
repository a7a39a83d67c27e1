#!/usr/bin/python3
"""Trains a byte-level BPE tokenizer (GPT-2's scheme) and writes it as Hugging Face files.

  train_tokenizer.py --corpus corpus/train.txt --vocab 4096 --out model/

tokenizer.json (ByteLevel pre-tokenizer with GPT-2's split pattern, BPE model, ByteLevel
decoder), tokenizer_config.json (eos, a ChatML chat template) and generation_config.json. Ids:
the 256 bytes, then the merges in the order learned, then <|endoftext|> (EOS, also the document
separator in training), <|im_start|>, <|im_end|>. Deterministic: ties break on the pair itself.
"""
import argparse
import collections
import json
import os

import regex

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def byte_to_unicode():
    """GPT-2's map from bytes to printable characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def train(text, vocab_size):
    chars = byte_to_unicode()
    counts = collections.Counter(regex.findall(GPT2_SPLIT, text))
    words = [[chars[b] for b in w.encode("utf-8")] for w in counts]
    freqs = list(counts.values())
    pairs = collections.Counter()
    where = collections.defaultdict(set)  # pair -> indices of words holding it
    for i, w in enumerate(words):
        for a, b in zip(w, w[1:]):
            pairs[(a, b)] += freqs[i]
            where[(a, b)].add(i)
    merges = []
    target = vocab_size - 256 - len(SPECIALS)
    while len(merges) < target and pairs:
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        if pairs[best] < 2:
            break
        merges.append(best)
        joined = best[0] + best[1]
        for i in list(where[best]):
            w = words[i]
            for a, b in zip(w, w[1:]):  # drop this word's old pairs
                pairs[(a, b)] -= freqs[i]
                if pairs[(a, b)] <= 0:
                    del pairs[(a, b)]
                where[(a, b)].discard(i)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == best[0] and w[j + 1] == best[1]:
                    out.append(joined)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for a, b in zip(out, out[1:]):
                pairs[(a, b)] += freqs[i]
                where[(a, b)].add(i)
        where.pop(best, None)
        pairs.pop(best, None)
    return chars, merges


def write(out_dir, chars, merges):
    vocab = {chars[b]: b for b in range(256)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    added = []
    for name in SPECIALS:
        added.append({"id": len(vocab) + len(added), "content": name, "single_word": False,
                      "lstrip": False, "rstrip": False, "normalized": False, "special": True})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    eos, im_end = added[0]["id"], added[2]["id"]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        # GPT-2's convention: <|endoftext|> ends a document and so stands before the next one;
        # the model is trained without a BOS of its own (add_bos_token false).
        json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>",
                   "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast",
                   "model_max_length": 512, "chat_template": CHAT_TEMPLATE}, f, indent=2)
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": [eos, im_end]}, f, indent=2)
    return len(vocab) + len(added)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", required=True)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    with open(args.corpus, encoding="utf-8") as f:
        text = f.read()
    chars, merges = train(text, args.vocab)
    size = write(args.out, chars, merges)
    print(f"{len(merges)} merges, vocabulary of {size}")


if __name__ == "__main__":
    main()
