#!/usr/bin/python3
"""Converts a Hugging Face / kiln model directory (config.json + safetensors) to a GGUF v3 file.

    /usr/bin/python3 tools/gguf/safetensors_to_gguf.py MODEL_DIR OUT.gguf [--vocab auto|none]

Written for kiln's side-by-side benchmark against llama.cpp (bench/llamacpp_compare.cc): the
same weights in llama.cpp's layout, so both programs run the same model. Needs only Python 3
and numpy (Debian's python3-numpy); it implements the GGUF format itself.

What it writes (as llama.cpp's own converter does for these architectures):
  - architectures LlamaForCausalLM / MistralForCausalLM (GGUF arch "llama"), Qwen2ForCausalLM
    ("qwen2", q/k/v biases) and Qwen3ForCausalLM ("qwen3", q/k norms);
  - matrices as bf16 (bf16 sources byte for byte; f32/f16 sources rounded to nearest even),
    vectors (norms, biases) as f32;
  - for "llama", q and k rows reordered from Hugging Face's rotate-half RoPE layout to the
    interleaved pairs llama.cpp's "llama" graph rotates (qwen2/qwen3 use the half-split layout
    llama.cpp calls NEOX, so they are copied as they are);
  - the tokenizer from tokenizer.json when it is a byte-level BPE (GPT-2, Llama 3, Qwen 2
    pre-tokenizers); without one (or with --vocab none) tokenizer.ggml.model "none" and
    {arch}.vocab_size, which llama.cpp loads as a vocabulary of that many nameless tokens:
    enough for llama-bench, which feeds random token ids.
Layers at or past num_hidden_layers (kiln's MTP draft heads) are left out.
"""

import argparse
import json
import math
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # pragma: no cover - depends on the machine
    sys.exit("safetensors_to_gguf: needs numpy (Debian: apt-get install python3-numpy; "
             "run with /usr/bin/python3)")

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# GGUF metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = (
    range(13))
# ggml tensor types.
GGML_F32, GGML_F16, GGML_BF16 = 0, 1, 30
GGML_TYPE_SIZE = {GGML_F32: 4, GGML_F16: 2, GGML_BF16: 2}
# llama_ftype: "mostly bf16".
FTYPE_MOSTLY_BF16 = 32
# llama.cpp token types.
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5

ARCHITECTURES = {  # config.json architectures[0] -> (GGUF arch, rows of q/k reordered for RoPE)
    "LlamaForCausalLM": ("llama", True),
    "MistralForCausalLM": ("llama", True),
    "Qwen2ForCausalLM": ("qwen2", False),
    "Qwen3ForCausalLM": ("qwen3", False),
}

# Hugging Face Split regexes of the byte-level BPE pre-tokenizers llama.cpp knows by name.
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                 r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
KNOWN_SPLIT_REGEXES = {_LLAMA3_REGEX: "llama-bpe", _QWEN2_REGEX: "qwen2"}


class ConversionError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Safetensors input


class SourceTensor:
    """One tensor in a safetensors file: where its bytes are, read on demand."""

    _DTYPES = {"BF16": np.uint16, "F16": np.float16, "F32": np.float32}

    def __init__(self, name, path, dtype, shape, begin, end):
        self.name, self.path, self.dtype, self.shape = name, path, dtype, tuple(shape)
        self.begin, self.end = begin, end

    def array(self):
        """The tensor as a numpy array: bf16 as its raw uint16 bits."""
        count = math.prod(self.shape)
        with open(self.path, "rb") as f:
            f.seek(self.begin)
            data = f.read(self.end - self.begin)
        return np.frombuffer(data, dtype=self._DTYPES[self.dtype], count=count).reshape(self.shape)


def read_safetensors_header(path):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        prefix = f.read(8)
        if len(prefix) != 8:
            raise ConversionError(f"{path}: too short for a safetensors file")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > size - 8:
            raise ConversionError(f"{path}: header length {header_len} runs past the file end")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise ConversionError(f"{path}: header is not JSON ({e})") from e
    data_start = 8 + header_len
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in SourceTensor._DTYPES:
            raise ConversionError(f"{path}: tensor {name} has dtype {dtype} (supported: BF16, F16, "
                                  "F32)")
        want = math.prod(shape) * np.dtype(SourceTensor._DTYPES[dtype]).itemsize
        if end - begin != want or data_start + end > size:
            raise ConversionError(f"{path}: tensor {name} has {end - begin} bytes at [{begin}, "
                                  f"{end}), expected {want} within the file")
        tensors[name] = SourceTensor(name, path, dtype, shape, data_start + begin, data_start + end)
    return tensors


def read_checkpoint_tensors(model_dir):
    index_path = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        files = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    if not files:
        raise ConversionError(f"{model_dir}: no *.safetensors files (and no "
                              "model.safetensors.index.json)")
    tensors = {}
    for file_name in files:
        path = os.path.join(model_dir, file_name)
        if not os.path.exists(path):
            raise ConversionError(f"{index_path} names {file_name}, which does not exist")
        for name, tensor in read_safetensors_header(path).items():
            if name in tensors:
                raise ConversionError(f"tensor {name} is in both {tensors[name].path} and {path}")
            tensors[name] = tensor
    return tensors


# ---------------------------------------------------------------------------------------------
# Model description


class ModelShape:
    def __init__(self, config, config_path):
        def need(key):
            if key not in config:
                raise ConversionError(f"{config_path}: missing {key}")
            return config[key]

        architectures = need("architectures")
        if not architectures or architectures[0] not in ARCHITECTURES:
            raise ConversionError(f"{config_path}: architecture {architectures} is not supported "
                                  f"(supported: {', '.join(ARCHITECTURES)})")
        self.hf_architecture = architectures[0]
        self.arch, self.reorder_rope_rows = ARCHITECTURES[self.hf_architecture]
        self.hidden = int(need("hidden_size"))
        self.intermediate = int(need("intermediate_size"))
        self.layers = int(need("num_hidden_layers"))
        self.heads = int(need("num_attention_heads"))
        self.kv_heads = int(config.get("num_key_value_heads") or self.heads)
        self.head_dim = int(config.get("head_dim") or self.hidden // self.heads)
        self.head_dim_in_config = config.get("head_dim") is not None
        self.vocab_size = int(need("vocab_size"))
        self.context = int(config.get("max_position_embeddings") or 2048)
        self.rms_eps = float(config.get("rms_norm_eps") or 1e-6)
        rope = config.get("rope_parameters") or {}
        self.rope_theta = float(config.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        self.tied = bool(config.get("tie_word_embeddings", False))
        self.rope_scaling = config.get("rope_scaling") or None
        if self.rope_scaling is None and rope.get("rope_type") not in (None, "default"):
            self.rope_scaling = rope
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type") or self.rope_scaling.get("type")
            if kind == "default":
                self.rope_scaling = None
            elif kind != "llama3":
                raise ConversionError(f"{config_path}: rope_scaling type {kind!r} is not "
                                      "supported (supported: llama3)")

    def llama3_rope_factors(self):
        """The per-frequency divisors llama.cpp reads from rope_freqs.weight for llama3 RoPE
        scaling (the rule of Hugging Face's _compute_llama3_parameters)."""
        s = self.rope_scaling
        factor = float(s.get("factor", 8.0))
        low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
        original = float(s.get("original_max_position_embeddings", 8192))
        low_wavelen, high_wavelen = original / low, original / high
        factors = []
        for i in range(0, self.head_dim, 2):
            freq = 1.0 / (self.rope_theta ** (i / self.head_dim))
            wavelen = 2 * math.pi / freq
            if wavelen < high_wavelen:
                factors.append(1.0)
            elif wavelen > low_wavelen:
                factors.append(factor)
            else:
                smooth = (original / wavelen - low) / (high - low)
                factors.append(1.0 / ((1 - smooth) / factor + smooth))
        return np.array(factors, dtype=np.float32)


# Per-layer Hugging Face tensor names -> llama.cpp names.
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
REQUIRED_LAYER_TENSORS = {
    "input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
    "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # recomputed by every runtime


def reorder_rope_rows(rows, heads):
    """Hugging Face keeps each head's rotary pairs as (x[i], x[i + d/2]); llama.cpp's "llama"
    graph rotates adjacent pairs (x[2i], x[2i+1]). Reorders the rows (output channels) of a q or
    k weight or bias so that row 2i of a head is HF row i and row 2i+1 is HF row i + d/2."""
    shape = rows.shape
    head_rows = shape[0] // heads
    return (rows.reshape(heads, 2, head_rows // 2, *shape[1:]).swapaxes(1, 2).reshape(shape))


class OutputTensor:
    def __init__(self, name, ggml_type, shape, produce):
        self.name, self.ggml_type, self.shape, self.produce = name, ggml_type, tuple(shape), produce
        self.nbytes = math.prod(self.shape) * GGML_TYPE_SIZE[ggml_type]
        self.offset = 0


def to_bf16_bits(source):
    """bf16 bits of a source tensor: bf16 as is, f16/f32 rounded to nearest even."""
    if source.dtype == "BF16":
        return source.array()
    f32 = np.ascontiguousarray(source.array(), dtype=np.float32)
    bits = f32.view(np.uint32)
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(f32), np.uint16(0x7FC0), rounded)


def to_f32(source):
    data = source.array()
    if source.dtype == "BF16":
        return (data.astype(np.uint32) << 16).view(np.float32)
    return data.astype(np.float32)


def plan_tensors(shape, tensors):
    """The GGUF tensors in file order, each with a function that yields its bytes."""
    out, used = [], set()

    def add(hf_name, gguf_name, reorder_heads=None):
        source = tensors[hf_name]
        used.add(hf_name)
        if len(source.shape) == 1:
            ggml_type, convert = GGML_F32, to_f32
        elif len(source.shape) == 2:
            ggml_type, convert = GGML_BF16, to_bf16_bits
        else:
            raise ConversionError(f"tensor {hf_name} has shape {list(source.shape)}; expected "
                                  "1 or 2 dimensions")

        def produce(source=source, convert=convert):
            data = convert(source)
            if reorder_heads is not None:
                data = reorder_rope_rows(data, reorder_heads)
            return np.ascontiguousarray(data).tobytes()

        # GGUF lists dimensions innermost first: a [rows, cols] matrix is ne = (cols, rows).
        out.append(OutputTensor(gguf_name, ggml_type, reversed(source.shape), produce))

    def expect_shape(hf_name, want):
        got = list(tensors[hf_name].shape)
        if got != list(want):
            raise ConversionError(f"tensor {hf_name} has shape {got}; config.json implies "
                                  f"{list(want)}")

    for required in ("model.embed_tokens.weight", "model.norm.weight"):
        if required not in tensors:
            raise ConversionError(f"checkpoint has no {required}")
    expect_shape("model.embed_tokens.weight", (shape.vocab_size, shape.hidden))
    add("model.embed_tokens.weight", "token_embd.weight")

    q_rows, kv_rows = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    for layer in range(shape.layers):
        prefix = f"model.layers.{layer}."
        for hf_suffix, gguf_suffix in LAYER_TENSORS.items():
            hf_name = prefix + hf_suffix
            if hf_name not in tensors:
                if hf_suffix in REQUIRED_LAYER_TENSORS or (
                        shape.arch == "qwen3" and hf_suffix.startswith(("self_attn.q_norm",
                                                                        "self_attn.k_norm"))):
                    raise ConversionError(f"checkpoint has no {hf_name}")
                continue  # optional: biases, and q/k norms outside Qwen 3
            want = {
                "self_attn.q_proj.weight": (q_rows, shape.hidden),
                "self_attn.k_proj.weight": (kv_rows, shape.hidden),
                "self_attn.v_proj.weight": (kv_rows, shape.hidden),
                "self_attn.o_proj.weight": (shape.hidden, q_rows),
                "self_attn.q_proj.bias": (q_rows,),
                "self_attn.k_proj.bias": (kv_rows,),
                "self_attn.v_proj.bias": (kv_rows,),
                "mlp.gate_proj.weight": (shape.intermediate, shape.hidden),
                "mlp.up_proj.weight": (shape.intermediate, shape.hidden),
                "mlp.down_proj.weight": (shape.hidden, shape.intermediate),
            }.get(hf_suffix)
            if want is not None:
                expect_shape(hf_name, want)
            reorder = None
            if shape.reorder_rope_rows and hf_suffix.startswith("self_attn.q_proj"):
                reorder = shape.heads
            elif shape.reorder_rope_rows and hf_suffix.startswith("self_attn.k_proj"):
                reorder = shape.kv_heads
            add(hf_name, f"blk.{layer}.{gguf_suffix}", reorder)

    add("model.norm.weight", "output_norm.weight")
    if "lm_head.weight" in tensors and not shape.tied:
        expect_shape("lm_head.weight", (shape.vocab_size, shape.hidden))
        add("lm_head.weight", "output.weight")
    elif not shape.tied:
        raise ConversionError("config.json has tie_word_embeddings false but the checkpoint has "
                              "no lm_head.weight")
    used.add("lm_head.weight")

    if shape.rope_scaling is not None:
        factors = shape.llama3_rope_factors()
        out.append(OutputTensor("rope_freqs.weight", GGML_F32, factors.shape,
                                lambda factors=factors: factors.tobytes()))

    skipped_layers = set()
    for name in tensors:
        if name in used or name.endswith(IGNORED_SUFFIXES):
            continue
        parts = name.split(".")
        layer = int(parts[2]) if name.startswith("model.layers.") and parts[2].isdigit() else -1
        if layer >= shape.layers:
            skipped_layers.add(layer)  # MTP draft heads: not part of the decoder stack
            continue
        raise ConversionError(f"tensor {name} has no GGUF counterpart in this converter")
    if skipped_layers:
        print(f"left out layers {sorted(skipped_layers)} (past num_hidden_layers = "
              f"{shape.layers}: draft heads llama.cpp does not run)", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------
# Vocabulary


def _token_id(tokenizer_vocab, value, what):
    if isinstance(value, dict):
        value = value.get("content")
    if value is None:
        return None
    if value not in tokenizer_vocab:
        raise ConversionError(f"tokenizer_config.json {what} {value!r} is not a token of "
                              "tokenizer.json")
    return tokenizer_vocab[value]


def _pre_tokenizer_name(pre, tokenizer_path):
    """llama.cpp's name for a byte-level BPE pre-tokenizer, read from its structure (llama.cpp's
    converter hashes the tokenization of a test text with transformers; this needs no
    transformers)."""
    if pre is None:
        raise ConversionError(f"{tokenizer_path}: no pre_tokenizer; pass --pre NAME")
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt-2"
    if pre.get("type") == "Sequence":
        splits = [p for p in pre.get("pretokenizers", []) if p.get("type") == "Split"]
        if len(splits) == 1:
            regex = splits[0].get("pattern", {}).get("Regex")
            if regex in KNOWN_SPLIT_REGEXES:
                return KNOWN_SPLIT_REGEXES[regex]
    raise ConversionError(f"{tokenizer_path}: pre-tokenizer not recognized (known: GPT-2 "
                          "ByteLevel, Llama 3 and Qwen 2 splits); pass --pre NAME with llama.cpp's "
                          "name for it, or --vocab none")


def vocabulary_metadata(model_dir, shape, config, pre_override):
    """Metadata entries [(key, type, value)] of the tokenizer in tokenizer.json."""
    tokenizer_path = os.path.join(model_dir, "tokenizer.json")
    with open(tokenizer_path, encoding="utf-8") as f:
        tokenizer = json.load(f)
    model = tokenizer.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ConversionError(f"{tokenizer_path}: only byte-level BPE tokenizers are converted "
                              f"(this one: {model.get('type')}"
                              f"{', byte_fallback' if model.get('byte_fallback') else ''}); "
                              "use --vocab none for a benchmark-only file")
    pre = pre_override or _pre_tokenizer_name(tokenizer.get("pre_tokenizer"), tokenizer_path)

    vocab = dict(model["vocab"])
    special, added = set(), set()
    for token in tokenizer.get("added_tokens", []):
        vocab[token["content"]] = token["id"]
        added.add(token["id"])
        if token.get("special"):
            special.add(token["id"])
    if vocab and max(vocab.values()) >= shape.vocab_size:
        raise ConversionError(f"{tokenizer_path}: token id {max(vocab.values())} is past "
                              f"config.json's vocab_size {shape.vocab_size}")
    by_id = {i: text for text, i in vocab.items()}
    tokens, types = [], []
    for i in range(shape.vocab_size):
        if i not in by_id:  # ids the model has rows for but the tokenizer never produces
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(TOKEN_CONTROL if i in special else
                         TOKEN_USER_DEFINED if i in added else TOKEN_NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]

    entries = [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, pre),
        ("tokenizer.ggml.tokens", (ARRAY, STRING), tokens),
        ("tokenizer.ggml.token_type", (ARRAY, INT32), types),
        ("tokenizer.ggml.merges", (ARRAY, STRING), merges),
    ]
    tokenizer_config = {}
    config_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.exists(config_path):
        with open(config_path, encoding="utf-8") as f:
            tokenizer_config = json.load(f)

    def first(value):
        return value[0] if isinstance(value, list) and value else value

    for what, key, config_key in (("bos_token", "bos_token_id", "bos_token_id"),
                                  ("eos_token", "eos_token_id", "eos_token_id"),
                                  ("pad_token", "padding_token_id", None)):
        token_id = _token_id(vocab, tokenizer_config.get(what), what)
        if token_id is None and config_key is not None:
            token_id = first(config.get(config_key))
        if token_id is not None:
            entries.append((f"tokenizer.ggml.{key}", UINT32, int(token_id)))
    if isinstance(tokenizer_config.get("add_bos_token"), bool):
        entries.append(("tokenizer.ggml.add_bos_token", BOOL, tokenizer_config["add_bos_token"]))
    if isinstance(tokenizer_config.get("chat_template"), str):
        entries.append(("tokenizer.chat_template", STRING, tokenizer_config["chat_template"]))
    return entries


# ---------------------------------------------------------------------------------------------
# GGUF output


def _string(text):
    data = text.encode("utf-8")
    return struct.pack("<Q", len(data)) + data


_SCALAR_FORMATS = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i",
                   FLOAT32: "<f", BOOL: "<?", UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}


def _value(value_type, value):
    if value_type == STRING:
        return _string(value)
    if isinstance(value_type, tuple):  # (ARRAY, element type)
        element_type = value_type[1]
        head = struct.pack("<IQ", element_type, len(value))
        if element_type == STRING:
            return head + b"".join(_string(v) for v in value)
        return head + np.asarray(value, dtype=np.dtype(_SCALAR_FORMATS[element_type])).tobytes()
    return struct.pack(_SCALAR_FORMATS[value_type], value)


def _align(n):
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def write_gguf(path, metadata, tensors):
    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(tensors), len(metadata)))
    for key, value_type, value in metadata:
        type_id = ARRAY if isinstance(value_type, tuple) else value_type
        header += _string(key) + struct.pack("<I", type_id) + _value(value_type, value)
    offset = 0
    for tensor in tensors:
        tensor.offset = offset
        header += _string(tensor.name) + struct.pack("<I", len(tensor.shape))
        header += struct.pack(f"<{len(tensor.shape)}Q", *tensor.shape)
        header += struct.pack("<IQ", tensor.ggml_type, tensor.offset)
        offset = _align(offset + tensor.nbytes)
    header += bytes(_align(len(header)) - len(header))

    temporary = path + ".partial"  # renamed into place only once complete
    with open(temporary, "wb") as f:
        f.write(header)
        for tensor in tensors:
            data = tensor.produce()
            if len(data) != tensor.nbytes:
                raise ConversionError(f"{tensor.name}: produced {len(data)} bytes, expected "
                                      f"{tensor.nbytes}")
            f.write(data)
            f.write(bytes(_align(len(data)) - len(data)))
    os.replace(temporary, path)


def convert(model_dir, out_path, vocab="auto", pre=None, name=None):
    config_path = os.path.join(model_dir, "config.json")
    if not os.path.exists(config_path):
        raise ConversionError(f"{model_dir}: no config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    shape = ModelShape(config, config_path)
    tensors = plan_tensors(shape, read_checkpoint_tensors(model_dir))

    arch = shape.arch
    metadata = [
        ("general.architecture", STRING, arch),
        ("general.name", STRING, name or os.path.basename(os.path.normpath(model_dir))),
        ("general.alignment", UINT32, ALIGNMENT),
        ("general.file_type", UINT32, FTYPE_MOSTLY_BF16),
        (f"{arch}.vocab_size", UINT32, shape.vocab_size),
        (f"{arch}.context_length", UINT32, shape.context),
        (f"{arch}.embedding_length", UINT32, shape.hidden),
        (f"{arch}.feed_forward_length", UINT32, shape.intermediate),
        (f"{arch}.block_count", UINT32, shape.layers),
        (f"{arch}.attention.head_count", UINT32, shape.heads),
        (f"{arch}.attention.head_count_kv", UINT32, shape.kv_heads),
        (f"{arch}.attention.layer_norm_rms_epsilon", FLOAT32, shape.rms_eps),
        (f"{arch}.rope.freq_base", FLOAT32, shape.rope_theta),
        (f"{arch}.rope.dimension_count", UINT32, shape.head_dim),
    ]
    if shape.head_dim_in_config:
        metadata += [(f"{arch}.attention.key_length", UINT32, shape.head_dim),
                     (f"{arch}.attention.value_length", UINT32, shape.head_dim)]
    has_tokenizer = os.path.exists(os.path.join(model_dir, "tokenizer.json"))
    if vocab == "auto" and has_tokenizer:
        metadata += vocabulary_metadata(model_dir, shape, config, pre)
    else:
        metadata.append(("tokenizer.ggml.model", STRING, "none"))
    write_gguf(out_path, metadata, tensors)
    return tensors


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="directory with config.json and *.safetensors")
    parser.add_argument("output", help="GGUF file to write")
    parser.add_argument("--vocab", choices=("auto", "none"), default="auto",
                        help="auto: tokenizer.json when present, else none; none: no tokenizer "
                        "(enough for llama-bench)")
    parser.add_argument("--pre", help="llama.cpp pre-tokenizer name, when it is not recognized")
    parser.add_argument("--name", help="general.name (default: the directory's name)")
    args = parser.parse_args(argv)
    try:
        tensors = convert(args.model_dir, args.output, args.vocab, args.pre, args.name)
    except (ConversionError, OSError, ValueError) as e:
        print(f"safetensors_to_gguf: {e}", file=sys.stderr)
        return 1
    except KeyError as e:
        print(f"safetensors_to_gguf: missing field {e} in a JSON file of {args.model_dir}",
              file=sys.stderr)
        return 1
    total = sum(t.nbytes for t in tensors)
    print(f"wrote {args.output}: {len(tensors)} tensors, {total / 1e9:.3f} GB of weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
