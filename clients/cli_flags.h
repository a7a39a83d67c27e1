// The flags of the `kiln` tool (defined in cli_flags.cc). Flags are shared between commands;
// each command's --help lists the ones it reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/flags/declare.h"

// Local commands (synth, run).
ABSL_DECLARE_FLAG(std::string, preset);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, quantize);
ABSL_DECLARE_FLAG(std::optional<uint64_t>, seed);
ABSL_DECLARE_FLAG(uint64_t, max_shard_bytes);
ABSL_DECLARE_FLAG(bool, overwrite);
ABSL_DECLARE_FLAG(bool, prepack);
ABSL_DECLARE_FLAG(std::string, backend);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);
ABSL_DECLARE_FLAG(int32_t, mtp_layers);

// Tensorizer files (run, tensorize, models load).
ABSL_DECLARE_FLAG(std::string, chat_template);
ABSL_DECLARE_FLAG(std::string, tensorizer_config);
ABSL_DECLARE_FLAG(std::string, encryption_key_file);
ABSL_DECLARE_FLAG(std::string, encryption_passphrase_file);
ABSL_DECLARE_FLAG(bool, skip_hash_verification);
ABSL_DECLARE_FLAG(std::string, hash_check);

// Connection.
ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(double, timeout);
ABSL_DECLARE_FLAG(std::string, tls_ca);
ABSL_DECLARE_FLAG(bool, tls);
ABSL_DECLARE_FLAG(std::string, admin_token);
ABSL_DECLARE_FLAG(std::string, admin_token_file);

// Generation.
ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(std::string, prompt_ids);
ABSL_DECLARE_FLAG(std::optional<int32_t>, max_tokens);
ABSL_DECLARE_FLAG(float, temperature);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(std::optional<float>, top_p);
ABSL_DECLARE_FLAG(float, min_p);
ABSL_DECLARE_FLAG(std::optional<float>, repetition_penalty);
ABSL_DECLARE_FLAG(float, presence_penalty);
ABSL_DECLARE_FLAG(float, frequency_penalty);
ABSL_DECLARE_FLAG(std::string, stop);
ABSL_DECLARE_FLAG(std::string, stop_token_ids);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(int32_t, logprobs);
ABSL_DECLARE_FLAG(bool, add_special_tokens);
ABSL_DECLARE_FLAG(std::optional<int32_t>, draft_tokens);
ABSL_DECLARE_FLAG(bool, ids);

// Tokenize, health, models.
ABSL_DECLARE_FLAG(std::string, text);
ABSL_DECLARE_FLAG(std::string, text_file);
ABSL_DECLARE_FLAG(int64_t, context);
ABSL_DECLARE_FLAG(int64_t, max_windows);
ABSL_DECLARE_FLAG(std::string, service);
ABSL_DECLARE_FLAG(bool, wait);
ABSL_DECLARE_FLAG(std::string, format);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(bool, verbose);
