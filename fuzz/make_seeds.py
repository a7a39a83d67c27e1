#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets (fuzz/corpus/<target>/) from tests/data, the
embedded default model and the unit tests' inline fixtures. Deterministic: rerun it after the
test data changes. Seeds stay small (the largest a few KiB): big real files are cut down to
their structure (safetensors headers with tiny shapes, Tensorizer files with their 256 KiB
index region compacted, tokenizer.json with a few hundred tokens)."""

import argparse
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARD_SEPARATOR = b"\n--kiln-shard--\n"
FILE_SEPARATOR = b"\n--kiln-file--\n"
CONTEXT_SEPARATOR = b"\n--kiln-context--\n"


def read(relative):
    with open(os.path.join(ROOT, relative), "rb") as f:
        return f.read()


class Corpus:
    def __init__(self, out):
        self.out = out
        self.total = 0
        self.written = set()

    def add(self, target, name, data):
        if isinstance(data, str):
            data = data.encode()
        directory = os.path.join(self.out, target)
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, name)
        with open(path, "wb") as f:
            f.write(data)
        self.written.add(path)
        self.total += len(data)

    def remove_stale(self):
        """Seeds left from an earlier version of this script. Files are rewritten in place, never
        the directories, so that a fuzzer starting meanwhile still finds its seeds."""
        for directory, _, names in os.walk(self.out):
            for name in names:
                path = os.path.join(directory, name)
                if path not in self.written:
                    os.remove(path)


# --- safetensors -------------------------------------------------------------------------

DTYPE_SIZES = {"F32": 4, "F16": 2, "BF16": 2}


def safetensors_file(tensors, metadata=None):
    """tensors: [(name, dtype, shape)] → bytes, data filled with a counting pattern."""
    header = {}
    if metadata is not None:
        header["__metadata__"] = metadata
    offset = 0
    for name, dtype, shape in tensors:
        size = DTYPE_SIZES[dtype]
        for d in shape:
            size *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # writers pad the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + bytes(i % 251 for i in range(offset))


def llama_tiny_tensors(dtype):
    """The tensor names of tests/data/llama_tiny/model.safetensors, each shrunk to a tiny shape."""
    blob = read("tests/data/llama_tiny/model.safetensors")
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        shape = [2] * len(info["shape"])
        tensors.append((name, dtype, shape))
    return tensors


def add_safetensors(corpus):
    for dtype in ("F32", "F16", "BF16"):
        corpus.add("safetensors", f"llama_tiny_{dtype.lower()}.safetensors",
                   safetensors_file(llama_tiny_tensors(dtype), {"format": "pt"}))
    corpus.add("safetensors", "mixed.safetensors",
               safetensors_file([("a", "F32", [2, 3]), ("b", "BF16", [4]), ("c", "F16", []),
                                 ("empty", "F32", [0, 5])]))
    corpus.add("safetensors", "empty_header.safetensors", struct.pack("<Q", 2) + b"{}")

    tensors = llama_tiny_tensors("F32")
    for shards in (1, 2, 3):
        parts, weight_map = [], {}
        for index in range(shards):
            name = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            mine = tensors[index::shards]
            for tensor in mine:
                weight_map[tensor[0]] = name
            parts.append(safetensors_file(mine, {"format": "pt"}))
        index_json = json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map},
                                indent=2).encode()
        corpus.add("safetensors_sharded", f"llama_tiny_{shards}_shards",
                   SHARD_SEPARATOR.join([index_json] + parts))


# --- tensorizer ------------------------------------------------------------------------------

def compact_tensorizer(blob):
    """The same file with its index region cut to the entries it holds (writers reserve 256 KiB,
    mostly zeros, where a fuzzer's mutations would be wasted). Offsets move with the records."""
    version, = struct.unpack_from("<I", blob, 5)
    count, = struct.unpack_from("<Q", blob, 57)
    index_size, = struct.unpack_from("<Q", blob, 65)
    pos = 73
    offsets = []
    for _ in range(count):
        name_len, = struct.unpack_from("<H", blob, pos)
        pos += 2 + name_len + 1
        dtype_len = blob[pos]
        pos += 1 + dtype_len
        ndims = blob[pos]
        pos += 1 + 4 * ndims
        offsets.append(pos)
        pos += 24
    used = pos - 73
    removed = index_size - used
    out = bytearray(blob[:73 + used] + blob[73 + index_size:])
    struct.pack_into("<Q", out, 65, used)
    for at in offsets:
        header_offset, data_offset, data_length = struct.unpack_from("<QQQ", out, at)
        struct.pack_into("<QQ", out, at, header_offset - removed, data_offset - removed)
    return bytes(out), version


def add_tensorizer(corpus):
    for name in ("edge_cases.tensors", "edge_cases_encrypted_rawkey.tensors"):
        compact, version = compact_tensorizer(read(f"tests/data/tensorizer/{name}"))
        corpus.add("tensorizer", f"compact_v{version}_{name}", compact)


# --- model config --------------------------------------------------------------------------

def add_model_config(corpus):
    llama = read("tests/data/llama_tiny/config.json")
    corpus.add("model_config", "llama_tiny.json", llama)
    corpus.add("model_config", "kiln_brown.json", read("checkpoints/kiln-brown/config.json"))
    base = json.loads(llama)
    variants = {
        "qwen2": {"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096},
        "qwen3": {"architectures": ["Qwen3ForCausalLM"], "head_dim": 32, "attention_bias": True},
        "mistral": {"architectures": ["MistralForCausalLM"], "sliding_window": None},
        "llama3_rope": {"rope_scaling": {"rope_type": "llama3", "factor": 32.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 8192},
                        "eos_token_id": [1, 2, 3]},
        "mtp": {"num_nextn_predict_layers": 1, "tie_word_embeddings": True},
        "mtp_qwen35": {"mtp_num_hidden_layers": 2, "text_config": {"hidden_size": 64}},
    }
    for name, changes in variants.items():
        config = dict(base)
        config.update(changes)
        corpus.add("model_config", f"{name}.json", json.dumps(config, indent=1))


# --- tokenizers ------------------------------------------------------------------------------

def inline_json_fixtures(relative_dir):
    """The R"json(...)json" literals of the unit tests under `relative_dir`."""
    found = []
    directory = os.path.join(ROOT, relative_dir)
    for name in sorted(os.listdir(directory)):
        if name.endswith(".cc"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                found += re.findall(r'R"json\((.*?)\)json"', f.read(), re.S)
    return found


def shrunk_tokenizer(text, keep):
    """A real tokenizer.json cut to its first `keep` tokens and the merges among them."""
    tokenizer = json.loads(text)
    model = tokenizer["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < keep}
    merges = []
    for merge in model.get("merges", []):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        if left in vocab and right in vocab and left + right in vocab:
            merges.append(merge)
    model["vocab"], model["merges"] = vocab, merges
    tokenizer["added_tokens"] = [t for t in tokenizer.get("added_tokens", [])][:4]
    for i, token in enumerate(tokenizer["added_tokens"]):
        token["id"] = keep + i
    return json.dumps(tokenizer, ensure_ascii=False).encode()


def add_tokenizer_json(corpus):
    for i, text in enumerate(inline_json_fixtures("tests/tokenizer")):
        corpus.add("tokenizer_json", f"unit_test_{i:02d}.json", text)
    brown = shrunk_tokenizer(read("checkpoints/kiln-brown/tokenizer.json"), 300)
    corpus.add("tokenizer_json", "kiln_brown_300.json",
               FILE_SEPARATOR.join([brown, read("checkpoints/kiln-brown/tokenizer_config.json"),
                                    read("checkpoints/kiln-brown/generation_config.json")]))
    mistral = shrunk_tokenizer(read("tests/data/tokenizers/mistral/tokenizer.json"), 400)
    corpus.add("tokenizer_json", "mistral_400.json",
               FILE_SEPARATOR.join([mistral, read("tests/data/tokenizers/mistral/tokenizer_config.json")]))
    qwen3 = shrunk_tokenizer(read("tests/data/tokenizers/qwen3/tokenizer.json"), 300)
    corpus.add("tokenizer_json", "qwen3_300.json", qwen3)


def add_tokenizer_encode(corpus):
    strings = json.loads(read("tests/data/tokenizers/corpus.json"))["strings"]
    texts = [entry["text"] for entry in strings[::8]]  # every category, 1 in 8
    texts.append(read("tests/data/kiln-brown/heldout.txt")[:1500].decode("utf-8", "ignore"))
    for i, text in enumerate(texts):
        # The first byte picks the tokenizer and the flags (see fuzz_tokenizer_encode.cc).
        corpus.add("tokenizer_encode", f"text_{i:02d}", bytes([i % 8]) + text.encode()[:2048])


# --- chat templates ------------------------------------------------------------------------

def add_chat_template(corpus):
    features = json.loads(read("tests/data/chat_templates/expected_features.json"))["cases"]
    for case in features:
        corpus.add("chat_template", case["name"],
                   case["template"].encode() + CONTEXT_SEPARATOR + json.dumps(case["context"]).encode())
    for name in ("qwen3", "llama3_1", "deepseek_v3", "gemma3"):
        template = read(f"tests/data/chat_templates/{name}.jinja")
        cases = json.loads(read(f"tests/data/chat_templates/expected_{name}.json"))["cases"]
        # The case with the longest context (tools, tool calls, reasoning) and the first one.
        for case in (cases[0], max(cases, key=lambda c: len(json.dumps(c["context"])))):
            corpus.add("chat_template", f"{name}_{case['name']}",
                       template + CONTEXT_SEPARATOR + json.dumps(case["context"]).encode())


# --- OpenAI request bodies -----------------------------------------------------------------

def add_openai_request(corpus):
    bodies = {
        "chat_minimal": {"model": "default", "messages": [{"role": "user", "content": "Hi"}]},
        "chat_full": {
            "model": "default", "max_completion_tokens": 16, "temperature": 0.7, "top_p": 0.9,
            "top_k": 40, "min_p": 0.05, "seed": 3, "stop": ["\n\n", "END"], "n": 2,
            "stream": True, "stream_options": {"include_usage": True}, "logprobs": True,
            "top_logprobs": 5, "presence_penalty": 0.5, "frequency_penalty": 0.25,
            "repetition_penalty": 1.1, "stop_token_ids": [2], "ignore_eos": False,
            "add_generation_prompt": True, "chat_template_kwargs": {"enable_thinking": False},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "What is "},
                                             {"type": "text", "text": "2+2?"}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "add", "arguments": "{\"a\": 2, \"b\": 2}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4"}],
            "tools": [{"type": "function", "function": {
                "name": "add", "description": "Adds two integers",
                "parameters": {"type": "object", "properties": {
                    "a": {"type": "integer"}, "b": {"type": "integer"}}}}}],
            "tool_choice": "auto"},
        "chat_continue": {"model": "default", "continue_final_message": True,
                          "add_generation_prompt": False,
                          "messages": [{"role": "user", "content": "Say"},
                                       {"role": "assistant", "content": "The jury"}]},
        "completion_text": {"model": "default", "prompt": "The jury said", "max_tokens": 40,
                            "temperature": 0.7, "top_p": 0.9, "seed": 3},
        "completion_batch": {"model": "default", "prompt": ["a", "b"], "n": 2, "logprobs": 3,
                             "stream": True, "echo": False},
        "completion_ids": {"model": "default", "prompt": [[1, 2, 3], [4093]], "max_tokens": 1,
                           "add_special_tokens": False},
        "completion_stop": {"model": "default", "prompt": "x", "stop": "END", "best_of": 1,
                            "user": "u", "logit_bias": {}},
        "tokenize_prompt": {"model": "default", "prompt": "Hello", "add_special_tokens": True,
                            "return_token_strs": True},
        "tokenize_messages": {"model": "default",
                              "messages": [{"role": "user", "content": "Hello"}]},
        "detokenize": {"model": "default", "tokens": [10, 20, 4093]},
    }
    for name, body in bodies.items():
        corpus.add("openai_request", name, json.dumps(body, indent=1))


# --- kiln.v1 GenerateRequest ---------------------------------------------------------------

def add_generate_request(corpus):
    with tempfile.TemporaryDirectory() as out:
        subprocess.run(["protoc", f"--proto_path={ROOT}/proto", f"--python_out={out}",
                        f"{ROOT}/proto/kiln/v1/kiln.proto"], check=True)
        sys.path.insert(0, out)
        from kiln.v1 import kiln_pb2  # noqa: E402  (generated just above)
        requests = {}
        r = kiln_pb2.GenerateRequest(model="default", prompt="In the spring of 1961,")
        r.sampling.temperature = 0.7
        r.sampling.top_p = 0.9
        r.sampling.seed = 3
        r.stopping.max_tokens = 60
        requests["text_sampled"] = r
        r = kiln_pb2.GenerateRequest(model="default", add_special_tokens=True, logprobs=5)
        r.prompt_token_ids.ids.extend([4093, 10, 20, 30])
        r.stopping.stop.extend(["\n", "."])
        r.stopping.stop_token_ids.extend([4093])
        r.stopping.ignore_eos = True
        r.speculative.num_draft_tokens = 2
        requests["ids_speculative"] = r
        r = kiln_pb2.GenerateRequest(model="default", prompt="x")
        r.sampling.top_k = 40
        r.sampling.min_p = 0.05
        r.sampling.repetition_penalty = 1.1
        r.sampling.presence_penalty = 0.5
        r.sampling.frequency_penalty = 0.2
        r.speculative.num_draft_tokens = 0
        requests["text_penalties"] = r
        for name, request in requests.items():
            corpus.add("generate_request", name, request.SerializeToString())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=os.path.join(ROOT, "fuzz", "corpus"))
    args = parser.parse_args()
    corpus = Corpus(args.out)
    for add in (add_safetensors, add_tensorizer, add_model_config, add_tokenizer_json,
                add_tokenizer_encode, add_chat_template, add_openai_request, add_generate_request):
        add(corpus)
    corpus.remove_stale()
    print(f"fuzz seeds: {corpus.total} bytes under {args.out}")


if __name__ == "__main__":
    main()
