#include "clients/cli_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, preset, "kiln-tiny", "model shape to write (synth)");
ABSL_FLAG(std::string, out, "",
          "synth: directory to write the checkpoint into; tensorize: the .tensors file to write");
ABSL_FLAG(std::string, dtype, "",
          "synth: weight dtype (bf16, f32, f16; default bf16); run and models load: compute dtype "
          "(bf16 or f32; default: the checkpoint's); tensorize: stored dtype (default: as is)");
ABSL_FLAG(std::string, quantize, "",
          "run, perplexity, models load and tensorize --prepack: weight quantization of the "
          "linears (none, int8 per output channel, int4 in groups of 32; default none)");
ABSL_FLAG(std::optional<uint64_t>, seed, std::nullopt,
          "synth: random seed (default 0); generate: sampling seed (default: the server picks)");
ABSL_FLAG(uint64_t, max_shard_bytes, uint64_t{1} << 30, "shard the checkpoint above this size");
ABSL_FLAG(bool, overwrite, false, "tensorize: replace an existing output file");
ABSL_FLAG(bool, prepack, false,
          "tensorize: store the linears packed for this machine's CPU kernels (and quantized as "
          "--quantize says), so a load adopts them and packs nothing; another machine unpacks "
          "them and packs as usual. models tensorize: store them as the server packed them");
ABSL_FLAG(std::string, backend, "",
          "run: compute backend (default cpu); models load: the server's backend for the model "
          "(default: the server's --backend)");
ABSL_FLAG(std::string, kv_cache_dtype, "",
          "models load: what the model's KV pool stores keys and values as: auto (the model's "
          "compute dtype), f32 or bf16 (half the memory); default: the server's "
          "--kv-cache-dtype");
ABSL_FLAG(int32_t, mtp_layers, 0,
          "synth: also write this many DeepSeek-style MTP heads (random weights; for speculative "
          "decoding tests)");

ABSL_FLAG(std::string, chat_template, "",
          "models load: a Jinja2 chat template file (read here, sent with the request) replacing "
          "the checkpoint's default");
ABSL_FLAG(std::string, tensorizer_config, "",
          "config.json for a raw or vLLM Tensorizer file (default: config.json beside it)");
ABSL_FLAG(std::string, encryption_key_file, "",
          "encrypted Tensorizer file: file holding the 32-byte key (models load: on the server)");
ABSL_FLAG(std::string, encryption_passphrase_file, "",
          "encrypted Tensorizer file: file holding the passphrase (models load: on the server)");
ABSL_FLAG(bool, skip_hash_verification, false,
          "Tensorizer: do not check each tensor's CRC32 and SHA-256 (as --hash_check none)");
ABSL_FLAG(std::string, hash_check, "",
          "Tensorizer: the stored hashes to check: all (CRC32 and SHA-256; the default), crc32 "
          "(CRC32 only: a fast check against damage, not tampering) or none");

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "kiln-server address, HOST:PORT");
ABSL_FLAG(double, timeout, 0, "deadline of the call in seconds; 0 = none");
ABSL_FLAG(std::string, tls_ca, "",
          "connect with TLS, trusting the CA certificates (PEM) in this file");
ABSL_FLAG(bool, tls, false, "connect with TLS, trusting the system's CA certificates");
ABSL_FLAG(std::string, admin_token, "",
          "token sent as \"authorization: Bearer TOKEN\" on Models calls");
ABSL_FLAG(std::string, admin_token_file, "",
          "file holding the admin token (surrounding whitespace is ignored)");

ABSL_FLAG(std::string, model, "",
          "run and tensorize: model directory or .tensors file; generate and tokenize: name of a "
          "loaded model");
ABSL_FLAG(std::string, prompt, "", "text prompt");
ABSL_FLAG(std::string, prompt_ids, "",
          "prompt as comma-separated token ids (run: default 1,2,3,4,5)");
ABSL_FLAG(std::optional<int32_t>, max_tokens, std::nullopt,
          "tokens to generate (generate: default the server's; run: default 16)");
ABSL_FLAG(float, temperature, 0, "sampling temperature; 0 = greedy");
ABSL_FLAG(int32_t, top_k, 0, "sample from the k most likely tokens; 0 = off");
ABSL_FLAG(std::optional<float>, top_p, std::nullopt, "nucleus sampling mass; unset = off");
ABSL_FLAG(float, min_p, 0, "drop tokens below min_p times the top probability; 0 = off");
ABSL_FLAG(std::optional<float>, repetition_penalty, std::nullopt,
          "penalty for tokens already seen; unset = off");
ABSL_FLAG(float, presence_penalty, 0, "presence penalty");
ABSL_FLAG(float, frequency_penalty, 0, "frequency penalty");
ABSL_FLAG(std::string, stop, "",
          "stop string, not included in the output; repeat the flag or separate with commas; "
          "C escapes such as \\n are understood");
ABSL_FLAG(std::string, stop_token_ids, "", "comma-separated token ids that end generation");
ABSL_FLAG(bool, ignore_eos, false, "keep generating past the end-of-sequence token");
ABSL_FLAG(int32_t, logprobs, 0, "print the top-N log-probabilities of each token (stderr)");
ABSL_FLAG(bool, add_special_tokens, false,
          "text prompts: add BOS and the tokenizer's special tokens");
ABSL_FLAG(std::optional<int32_t>, draft_tokens, std::nullopt,
          "speculative decoding with the model's MTP heads: draft tokens per step (0 = off; "
          "unset: the server's default)");
ABSL_FLAG(bool, ids, false, "also print the generated token ids");

ABSL_FLAG(std::string, text, "", "text to tokenize");
ABSL_FLAG(std::string, text_file, "",
          "perplexity: text file, documents separated by blank lines (each followed by EOS)");
ABSL_FLAG(int64_t, context, 512, "perplexity: positions per window");
ABSL_FLAG(int64_t, max_windows, 0, "perplexity: score at most this many windows; 0 = all");
ABSL_FLAG(std::string, service, "", "health service name; empty = the whole server");
ABSL_FLAG(bool, wait, false, "health: wait for the server to come up (bounded by --timeout)");
ABSL_FLAG(std::string, format, "", "checkpoint format; empty = detect");
ABSL_FLAG(bool, json, false, "print the reply as JSON");
ABSL_FLAG(bool, verbose, false, "models get: also list every placed tensor");
