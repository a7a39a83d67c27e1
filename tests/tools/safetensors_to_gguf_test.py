#!/usr/bin/python3
"""tools/gguf/safetensors_to_gguf.py on small checkpoints, read back with a GGUF reader of this
test's own (written from the GGUF v3 spec, sharing no code with the converter):

  - a Qwen 2 written here (q/k/v biases, tied embeddings, no tokenizer; bf16, f16 and f32
    tensors);
  - a Llama with llama3 RoPE scaling, an untied head and attention biases, written here;
  - `kiln synth --preset kiln-tiny` (Llama, byte-level BPE tokenizer), sharded with an index
    and an MTP head.

Each file is checked for magic, version, metadata against config.json (values and types),
tensor names, shapes, types, offsets and alignment, and its tensor bytes against the
safetensors bytes (bf16 as is, q/k rows un-permuted for Llama; f32 sources rounded to the
nearest bf16). Needs /usr/bin/python3 and python3-numpy.

    /usr/bin/python3 tests/tools/safetensors_to_gguf_test.py --converter PATH [--kiln PATH]
"""

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

ARGS = None

# GGUF v3 metadata value types, ggml tensor types and llama.cpp token types.
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)
SCALAR = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
          T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
          T_FLOAT64: "<d"}
GGML_F32, GGML_BF16 = 0, 30
TYPE_BYTES = {GGML_F32: 4, GGML_BF16: 2}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_UNUSED = 1, 3, 5


class GgufFile:
    """A GGUF v3 file parsed field by field."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.bytes = f.read()
        self.pos = 0
        self.magic = self._take(4)
        self.version, tensor_count, kv_count = self._unpack("<IQQ")
        self.metadata = {}  # key -> (type, value); arrays as (T_ARRAY, (element type, list))
        for _ in range(kv_count):
            key = self._string()
            (value_type,) = self._unpack("<I")
            if key in self.metadata:
                raise ValueError(f"duplicate key {key}")
            self.metadata[key] = (value_type, self._value(value_type))
        self.tensors = {}
        self.order = []
        for _ in range(tensor_count):
            name = self._string()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            ggml_type, offset = self._unpack("<IQ")
            self.tensors[name] = {"dims": tuple(dims), "type": ggml_type, "offset": offset}
            self.order.append(name)
        self.header_end = self.pos
        alignment = self.metadata.get("general.alignment", (T_UINT32, 32))[1]
        self.alignment = alignment
        self.data_start = (self.header_end + alignment - 1) // alignment * alignment

    def _take(self, n):
        if self.pos + n > len(self.bytes):
            raise ValueError(f"file ends at {len(self.bytes)}, wanted {n} bytes at {self.pos}")
        data = self.bytes[self.pos:self.pos + n]
        self.pos += n
        return data

    def _unpack(self, fmt):
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))

    def _string(self):
        (n,) = self._unpack("<Q")
        return self._take(n).decode("utf-8")

    def _value(self, value_type):
        if value_type == T_STRING:
            return self._string()
        if value_type == T_ARRAY:
            element_type, n = self._unpack("<IQ")
            return element_type, [self._value(element_type) for _ in range(n)]
        return self._unpack(SCALAR[value_type])[0]

    def nbytes(self, name):
        t = self.tensors[name]
        return int(np.prod(t["dims"])) * TYPE_BYTES[t["type"]]

    def data(self, name):
        t = self.tensors[name]
        begin = self.data_start + t["offset"]
        return self.bytes[begin:begin + self.nbytes(name)]


# ---------------------------------------------------------------------------------------------
# Checkpoints written by the test


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy array of the stored bits)."""
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def random_bf16(rng, shape):
    bits = (rng.standard_normal(shape).astype(np.float32) * 0.02).view(np.uint32) >> 16
    return "BF16", bits.astype(np.uint16)


def write_tiny_model(directory, config, biases, f16_names=(), f32_names=()):
    rng = np.random.default_rng(7)
    hidden, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim, inter = config["head_dim"], config["intermediate_size"]
    shapes = {"model.embed_tokens.weight": (config["vocab_size"], hidden),
              "model.norm.weight": (hidden,)}
    if not config["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (config["vocab_size"], hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        })
        if biases:
            shapes.update({p + "self_attn.q_proj.bias": (heads * head_dim,),
                           p + "self_attn.k_proj.bias": (kv_heads * head_dim,),
                           p + "self_attn.v_proj.bias": (kv_heads * head_dim,)})
    tensors = {}
    for name, shape in shapes.items():
        if name in f16_names:
            tensors[name] = ("F16", (rng.standard_normal(shape) * 0.02).astype(np.float16))
        elif name in f32_names:
            values = (rng.standard_normal(shape) * 0.02).astype(np.float32)
            # Exact halfway cases, ties to an even and to an odd bf16 pattern, which rounding
            # half up or truncating gets wrong.
            ties = np.array([0x3C008000, 0x3C018000, 0xBC028000, 0xBC038000], dtype=np.uint32)
            values.reshape(-1)[:len(ties)] = ties.view(np.float32)
            tensors[name] = ("F32", values)
        else:
            tensors[name] = random_bf16(rng, shape)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(config, f)
    write_safetensors(os.path.join(directory, "model.safetensors"), tensors)


def read_safetensors(directory):
    """name -> (dtype, shape, raw bytes) over every shard."""
    out = {}
    for file_name in sorted(os.listdir(directory)):
        if not file_name.endswith(".safetensors"):
            continue
        with open(os.path.join(directory, file_name), "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        for name, info in json.loads(blob[8:8 + n]).items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            out[name] = (info["dtype"], tuple(info["shape"]), blob[8 + n + begin:8 + n + end])
    return out


def nearest_bf16_bits(values):
    """bf16 bits nearest to each finite f32 value, ties to the even pattern: the two bf16
    values around x compared in value, not by the bit trick the converter uses."""
    values = values.astype(np.float32)
    low = values.view(np.uint32) >> 16
    high = low + 1
    low_value = (low << 16).view(np.float32).astype(np.float64)
    high_value = (high << 16).view(np.float32).astype(np.float64)
    x = values.astype(np.float64)
    low_distance, high_distance = np.abs(x - low_value), np.abs(high_value - x)
    pick_high = (high_distance < low_distance) | ((high_distance == low_distance) & (low % 2 == 1))
    return np.where(pick_high, high, low).astype(np.uint16)


HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


class ConverterTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="gguf-test-")
        self.addCleanup(self.tmp.cleanup)

    def path(self, *parts):
        return os.path.join(self.tmp.name, *parts)

    def run_converter(self, model_dir, out, *extra, expect_ok=True):
        result = subprocess.run([sys.executable, ARGS.converter, model_dir, out, *extra],
                                capture_output=True, text=True, timeout=60)
        if expect_ok:
            self.assertEqual(result.returncode, 0, result.stderr)
        return result

    def synth(self, out, *extra):
        if not ARGS.kiln:
            self.skipTest("needs --kiln")
        result = subprocess.run([ARGS.kiln, "synth", "--preset", "kiln-tiny", "--out", out,
                                 *extra], capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 0, result.stderr)

    # The checks every converted file gets.
    def check_file(self, model_dir, gguf_path, arch, permuted):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        g = GgufFile(gguf_path)
        self.assertEqual(g.magic, b"GGUF")
        self.assertEqual(g.version, 3)
        self.assertEqual(g.alignment, 32)
        meta = g.metadata
        self.assertEqual(meta["general.architecture"], (T_STRING, arch))
        self.assertEqual(meta["general.file_type"], (T_UINT32, 32))  # mostly bf16
        heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
        kv_heads = config.get("num_key_value_heads", heads)
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
        expected = {
            "context_length": (T_UINT32, config["max_position_embeddings"]),
            "embedding_length": (T_UINT32, config["hidden_size"]),
            "feed_forward_length": (T_UINT32, config["intermediate_size"]),
            "block_count": (T_UINT32, layers),
            "vocab_size": (T_UINT32, config["vocab_size"]),
            "attention.head_count": (T_UINT32, heads),
            "attention.head_count_kv": (T_UINT32, kv_heads),
            "rope.dimension_count": (T_UINT32, head_dim),
            "attention.layer_norm_rms_epsilon": (T_FLOAT32,
                                                 float(np.float32(config["rms_norm_eps"]))),
            "rope.freq_base": (T_FLOAT32, float(np.float32(config["rope_theta"]))),
        }
        for key, value in expected.items():
            self.assertEqual(meta.get(f"{arch}.{key}"), value, key)

        # Layout: offsets aligned, in order, non-overlapping, the file ends after the last one.
        end = 0
        for name in g.order:
            offset = g.tensors[name]["offset"]
            self.assertEqual(offset % 32, 0, name)
            self.assertGreaterEqual(offset, end, name)
            end = offset + g.nbytes(name)
        self.assertEqual(g.data_start % 32, 0)
        self.assertLessEqual(g.data_start + end, len(g.bytes))
        self.assertLess(len(g.bytes) - (g.data_start + end), 32)
        self.assertTrue(all(b == 0 for b in g.bytes[g.header_end:g.data_start]))

        # Names: exactly the decoder's tensors (draft-head layers left out).
        source = read_safetensors(model_dir)
        mapping = {"model.embed_tokens.weight": "token_embd.weight",
                   "model.norm.weight": "output_norm.weight"}
        if not config.get("tie_word_embeddings", False):
            mapping["lm_head.weight"] = "output.weight"
        for name in source:
            parts = name.split(".")
            if name.startswith("model.layers.") and int(parts[2]) < layers:
                mapping[name] = f"blk.{parts[2]}.{HF_TO_GGUF['.'.join(parts[3:])]}"
        expected_names = set(mapping.values())
        if config.get("rope_scaling"):
            expected_names.add("rope_freqs.weight")
        self.assertEqual(set(g.tensors), expected_names)

        for hf_name, gguf_name in mapping.items():
            dtype, shape, raw = source[hf_name]
            t = g.tensors[gguf_name]
            self.assertEqual(t["dims"], tuple(reversed(shape)), gguf_name)
            data = g.data(gguf_name)
            if len(shape) == 1:  # vectors: f32, exactly the stored value
                self.assertEqual(t["type"], GGML_F32, gguf_name)
                got = np.frombuffer(data, dtype=np.float32)
                want = {"BF16": lambda: (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16)
                        .view(np.float32), "F16": lambda: np.frombuffer(raw, np.float16)
                        .astype(np.float32), "F32": lambda: np.frombuffer(raw, np.float32)}[dtype]()
            else:  # matrices: bf16
                self.assertEqual(t["type"], GGML_BF16, gguf_name)
                got = np.frombuffer(data, dtype=np.uint16)
                if dtype == "BF16":
                    want = np.frombuffer(raw, dtype=np.uint16)
                else:
                    want = nearest_bf16_bits(np.frombuffer(raw, {"F32": np.float32,
                                                                 "F16": np.float16}[dtype]))
            if permuted and (".attn_q." in gguf_name or ".attn_k." in gguf_name):
                # GGUF row 2i of a head holds HF row i, row 2i+1 holds HF row i + d/2.
                n_heads = heads if ".attn_q." in gguf_name else kv_heads
                rows = shape[0]
                got = got.reshape(rows, -1)
                hf_rows = []
                for h in range(n_heads):
                    for i in range(head_dim // 2):
                        hf_rows += [h * head_dim + i, h * head_dim + i + head_dim // 2]
                self.assertNotEqual(hf_rows, list(range(rows)))
                unpermuted = np.empty_like(got)
                unpermuted[hf_rows] = got
                got = unpermuted.reshape(-1)
            np.testing.assert_array_equal(got, want, err_msg=gguf_name)
        return g

    def test_qwen2_biases_tied_no_tokenizer(self):
        model = self.path("qwen2")
        config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
                  "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                  "vocab_size": 300, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
                  "rope_theta": 1000000.0, "tie_word_embeddings": True}
        write_tiny_model(model, config, biases=True,
                         f16_names={"model.layers.1.mlp.up_proj.weight",
                                    "model.layers.1.self_attn.v_proj.bias"},
                         f32_names={"model.layers.0.mlp.down_proj.weight",
                                    "model.layers.0.self_attn.q_proj.bias"})
        out = self.path("qwen2.gguf")
        self.run_converter(model, out)
        g = self.check_file(model, out, "qwen2", permuted=False)
        self.assertEqual(g.metadata["tokenizer.ggml.model"], (T_STRING, "none"))
        self.assertNotIn("tokenizer.ggml.tokens", g.metadata)
        self.assertEqual(g.metadata["qwen2.attention.key_length"], (T_UINT32, 16))
        self.assertIn("blk.1.attn_v.bias", g.tensors)
        self.assertNotIn("output.weight", g.tensors)  # tied: llama.cpp reuses token_embd

    def test_llama_untied_biases_llama3_rope(self):
        model = self.path("llama")
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                  "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
                  "vocab_size": 100, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                  "rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": True,
                  "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 8192}}
        write_tiny_model(model, config, biases=True)
        out = self.path("llama.gguf")
        self.run_converter(model, out)
        g = self.check_file(model, out, "llama", permuted=True)
        factors = np.frombuffer(g.data("rope_freqs.weight"), dtype=np.float32)
        self.assertEqual(g.tensors["rope_freqs.weight"]["dims"], (8,))
        # Highest frequency (wavelength 2π) is kept, the lowest is divided by the full factor.
        self.assertEqual(factors[0], 1.0)
        self.assertEqual(factors[-1], 32.0)
        self.assertTrue(np.all(np.diff(factors) >= 0))

    def test_kiln_synth_sharded_with_tokenizer_and_mtp(self):
        model = self.path("kiln-tiny")
        self.synth(model, "--max_shard_bytes", "1000000", "--mtp_layers", "1")
        self.assertTrue(os.path.exists(os.path.join(model, "model.safetensors.index.json")))
        out = self.path("kiln-tiny.gguf")
        result = self.run_converter(model, out)
        self.assertIn("left out layers [4]", result.stderr)
        g = self.check_file(model, out, "llama", permuted=True)

        with open(os.path.join(model, "tokenizer.json")) as f:
            tokenizer = json.load(f)
        meta = g.metadata
        self.assertEqual(meta["tokenizer.ggml.model"], (T_STRING, "gpt2"))
        self.assertEqual(meta["tokenizer.ggml.pre"], (T_STRING, "gpt-2"))
        token_type, tokens = meta["tokenizer.ggml.tokens"][1]
        self.assertEqual(token_type, T_STRING)
        self.assertEqual(len(tokens), 512)
        for text, i in tokenizer["model"]["vocab"].items():
            self.assertEqual(tokens[i], text)
        types = meta["tokenizer.ggml.token_type"][1][1]
        for added in tokenizer["added_tokens"]:
            self.assertEqual(tokens[added["id"]], added["content"])
            self.assertEqual(types[added["id"]], TOKEN_CONTROL)
        self.assertEqual(types[0], TOKEN_NORMAL)
        merges = meta["tokenizer.ggml.merges"][1][1]
        self.assertEqual(merges, [m if isinstance(m, str) else " ".join(m)
                                  for m in tokenizer["model"]["merges"]])
        eos = tokens.index("<|endoftext|>")
        self.assertEqual(meta["tokenizer.ggml.eos_token_id"], (T_UINT32, eos))
        self.assertIn("tokenizer.chat_template", meta)

        # --vocab none drops the tokenizer, keeps the weights.
        bare = self.path("kiln-tiny-novocab.gguf")
        self.run_converter(model, bare, "--vocab", "none")
        g2 = GgufFile(bare)
        self.assertEqual(g2.metadata["tokenizer.ggml.model"], (T_STRING, "none"))
        self.assertEqual(g2.data("blk.3.attn_k.weight"), g.data("blk.3.attn_k.weight"))

    def test_errors_name_what_is_wrong(self):
        model = self.path("broken")
        config = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 32,
                  "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
                  "num_key_value_heads": 1, "head_dim": 16, "vocab_size": 50,
                  "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
                  "tie_word_embeddings": True}
        write_tiny_model(model, config, biases=False)
        # A missing tensor: named, and no partial output left behind.
        safetensors = read_safetensors(model)
        kept = {name: (dtype, np.frombuffer(raw, np.uint16).reshape(shape))
                for name, (dtype, shape, raw) in safetensors.items()
                if name != "model.layers.0.mlp.up_proj.weight"}
        write_safetensors(os.path.join(model, "model.safetensors"), kept)
        out = self.path("broken.gguf")
        result = self.run_converter(model, out, expect_ok=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("model.layers.0.mlp.up_proj.weight", result.stderr)
        self.assertFalse(os.path.exists(out))
        self.assertFalse(os.path.exists(out + ".partial"))
        # An architecture it does not convert.
        config["architectures"] = ["GPT2LMHeadModel"]
        with open(os.path.join(model, "config.json"), "w") as f:
            json.dump(config, f)
        result = self.run_converter(model, out, expect_ok=False)
        self.assertEqual(result.returncode, 1)
        self.assertIn("GPT2LMHeadModel", result.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--converter", required=True)
    parser.add_argument("--kiln", help="kiln CLI, for `kiln synth` checkpoints")
    ARGS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)
