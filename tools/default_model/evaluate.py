#!/usr/bin/python3
"""Held-out perplexity of a checkpoint train.py wrote, as train.py computes it.

  evaluate.py --model model/ --text corpus/heldout.txt [--max-windows N] [--json out.json]

The text is split into documents at blank lines; each document is encoded and followed by EOS,
and the token stream is cut into non-overlapping windows of --context tokens (each predicting
the next --context tokens). Prints the perplexity of the main model (token t+1) and of the MTP
head (token t+2, read from h_t and the embedding of token t+1), in fp32 from the bf16 weights.

With --json, writes those numbers, the window count and, with --ids, the token ids the windows
read: what tests/data/kiln-brown/heldout_reference.json records for kiln's own perplexity to be
checked against (--max-windows 3 there).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train import Model, Tokenizer, evaluate, load_kiln_state, read_safetensors  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="directory with config.json and "
                        "model.safetensors (and the tokenizer, unless --tokenizer)")
    parser.add_argument("--tokenizer", help="directory with tokenizer.json (default: --model)")
    parser.add_argument("--text", required=True)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--max-windows", type=int, default=None)
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--ids", action="store_true", help="include the token ids in --json")
    args = parser.parse_args()

    torch.manual_seed(0)
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    model = Model(config)
    load_kiln_state(model, read_safetensors(os.path.join(args.model, "model.safetensors")))
    tokenizer = Tokenizer(args.tokenizer or args.model)
    with open(args.text, encoding="utf-8") as f:
        ids = tokenizer.encode_documents(f.read())
    windows = len(range(0, len(ids) - args.context - 1, args.context))
    if args.max_windows is not None:
        windows = min(windows, args.max_windows)
    if windows == 0:
        sys.exit(f"{args.text}: {len(ids)} tokens, fewer than a window of {args.context} + 2")
    perplexity, mtp_perplexity = evaluate(model, ids, args.context, args.max_windows)
    print(f"{args.text}: {len(ids)} tokens, {windows} windows of {args.context}: perplexity "
          f"{perplexity:.4f}, MTP head (token t+2) {mtp_perplexity:.4f}")
    if args.json:
        result = {"text": os.path.basename(args.text), "context": args.context,
                  "windows": windows, "tokens": len(ids), "perplexity": perplexity,
                  "mtp_perplexity": mtp_perplexity, "torch": torch.__version__}
        if args.ids:
            result["ids"] = ids[:windows * args.context + 1]  # what the windows read
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1 if not args.ids else None)
            f.write("\n")


if __name__ == "__main__":
    main()
