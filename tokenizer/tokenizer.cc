#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "tokenizer/tokenizer_json.h"

namespace kiln {

using tokenizer_internal::AddedToken;
using tokenizer_internal::AddedVocabulary;
using tokenizer_internal::TokenizerConfig;
using tokenizer_internal::TokenizerParts;

class TokenizerImpl {
 public:
  static absl::StatusOr<std::unique_ptr<TokenizerImpl>> Create(TokenizerParts parts,
                                                               const TokenizerConfig& config,
                                                               std::vector<int32_t> eos_ids);

  absl::StatusOr<std::vector<int32_t>> Encode(absl::string_view text,
                                              bool add_special_tokens) const;
  absl::StatusOr<std::string> DecodeBytes(std::span<const int32_t> ids,
                                          bool skip_special_tokens) const;

  int32_t vocab_size() const { return vocab_size_; }
  std::optional<int32_t> TokenToId(absl::string_view token) const {
    if (std::optional<int32_t> id = parts_.added->FindByContent(token)) return id;
    return parts_.model->TokenToId(token);
  }
  // nullptr when the id has no token.
  const std::string* IdToToken(int32_t id) const {
    if (const AddedToken* added = parts_.added->FindById(id)) return &added->decoded;
    return parts_.model->IdToToken(id);
  }
  bool IsSpecial(int32_t id) const {
    const AddedToken* added = parts_.added->FindById(id);
    return added != nullptr && added->special;
  }
  const SpecialTokenIds& special_tokens() const { return special_; }

 private:
  explicit TokenizerImpl(TokenizerParts parts) : parts_(std::move(parts)) {}
  // Text between added tokens: normalizer, normalized added tokens, pre-tokenizer, model.
  absl::Status EncodeSegment(absl::string_view segment, bool at_start,
                             std::vector<int32_t>& ids) const;
  absl::Status PreTokenizeAndModel(absl::string_view text, bool first_piece,
                                   std::vector<int32_t>& ids) const;

  TokenizerParts parts_;
  SpecialTokenIds special_;
  int32_t vocab_size_ = 0;
  // tokenizer_config.json's add_bos_token / add_eos_token, where the post-processor lacks them.
  std::optional<int32_t> extra_bos_;
  std::optional<int32_t> extra_eos_;
};

absl::StatusOr<std::unique_ptr<TokenizerImpl>> TokenizerImpl::Create(TokenizerParts parts,
                                                                     const TokenizerConfig& config,
                                                                     std::vector<int32_t> eos_ids) {
  std::unique_ptr<TokenizerImpl> impl(new TokenizerImpl(std::move(parts)));
  const TokenizerParts& p = impl->parts_;
  impl->vocab_size_ = std::max(p.model->id_limit(), p.added->id_limit());
  // The crate accepts ids outside the vocabulary here (and drops them when decoding); they
  // are kept, with a warning, and Decode refuses them.
  auto check_ids = [&](const std::vector<int32_t>& ids, absl::string_view what) {
    for (int32_t id : ids) {
      if (id < 0 || impl->IdToToken(id) == nullptr) {
        LOG(WARNING) << what << ": id " << id << " is not in the vocabulary";
      }
    }
  };
  check_ids(p.post_processor.prefix, "tokenizer.json post_processor");
  check_ids(p.post_processor.suffix, "tokenizer.json post_processor");
  check_ids(eos_ids, "generation_config.json eos_token_id");

  auto lookup = [&](const std::optional<std::string>& token) -> std::optional<int32_t> {
    if (!token.has_value()) return std::nullopt;
    return impl->TokenToId(*token);
  };
  SpecialTokenIds& special = impl->special_;
  special.bos = lookup(config.bos_token);
  special.eos = lookup(config.eos_token);
  special.pad = lookup(config.pad_token);
  special.unk =
      lookup(config.unk_token.has_value() ? config.unk_token : p.model->options().unk_token);
  special.add_bos = config.add_bos_token;
  special.add_eos = config.add_eos_token;
  special.eos_ids = std::move(eos_ids);
  if (special.eos.has_value() && std::find(special.eos_ids.begin(), special.eos_ids.end(),
                                           *special.eos) == special.eos_ids.end()) {
    special.eos_ids.push_back(*special.eos);
  }
  auto contains = [](const std::vector<int32_t>& ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  if (special.add_bos && special.bos.has_value() &&
      !contains(p.post_processor.prefix, *special.bos)) {
    impl->extra_bos_ = special.bos;
  }
  if (special.add_eos && special.eos.has_value() &&
      !contains(p.post_processor.suffix, *special.eos)) {
    impl->extra_eos_ = special.eos;
  }
  return impl;
}

absl::StatusOr<std::vector<int32_t>> TokenizerImpl::Encode(absl::string_view text,
                                                           bool add_special_tokens) const {
  if (std::optional<size_t> bad = tokenizer_internal::FindInvalidUtf8(text)) {
    return absl::InvalidArgumentError(
        absl::StrCat("text is not valid UTF-8 at byte offset ", *bad));
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 8);
  if (add_special_tokens) {
    if (extra_bos_.has_value()) ids.push_back(*extra_bos_);
    ids.insert(ids.end(), parts_.post_processor.prefix.begin(), parts_.post_processor.prefix.end());
  }
  if (parts_.added->has_raw()) {
    for (const AddedVocabulary::Segment& segment : parts_.added->SplitRaw(text)) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      KILN_RETURN_IF_ERROR(EncodeSegment(text.substr(segment.begin, segment.end - segment.begin),
                                         segment.begin == 0, ids));
    }
  } else if (!text.empty()) {
    KILN_RETURN_IF_ERROR(EncodeSegment(text, /*at_start=*/true, ids));
  }
  if (add_special_tokens) {
    ids.insert(ids.end(), parts_.post_processor.suffix.begin(), parts_.post_processor.suffix.end());
    if (extra_eos_.has_value()) ids.push_back(*extra_eos_);
  }
  return ids;
}

absl::Status TokenizerImpl::EncodeSegment(absl::string_view segment, bool at_start,
                                          std::vector<int32_t>& ids) const {
  std::string normalized_storage;
  absl::string_view normalized = segment;
  if (parts_.normalizer != nullptr) {
    KILN_ASSIGN_OR_RETURN(normalized_storage, parts_.normalizer->Normalize(segment));
    normalized = normalized_storage;
  }
  if (normalized.empty()) return absl::OkStatus();
  if (!parts_.added->has_normalized()) return PreTokenizeAndModel(normalized, at_start, ids);
  for (const AddedVocabulary::Segment& piece : parts_.added->SplitNormalized(normalized)) {
    if (piece.id >= 0) {
      ids.push_back(piece.id);
      continue;
    }
    KILN_RETURN_IF_ERROR(
        PreTokenizeAndModel(normalized.substr(piece.begin, piece.end - piece.begin),
                            at_start && piece.begin == 0, ids));
  }
  return absl::OkStatus();
}

absl::Status TokenizerImpl::PreTokenizeAndModel(absl::string_view text, bool first_piece,
                                                std::vector<int32_t>& ids) const {
  if (parts_.pre_tokenizer == nullptr) return parts_.model->Tokenize(text, ids);
  std::vector<std::string> pieces;
  pieces.emplace_back(text.data(), text.size());
  KILN_RETURN_IF_ERROR(parts_.pre_tokenizer->PreTokenize(pieces, first_piece));
  for (const std::string& piece : pieces) {
    KILN_RETURN_IF_ERROR(parts_.model->Tokenize(piece, ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenizerImpl::DecodeBytes(std::span<const int32_t> ids,
                                                       bool skip_special_tokens) const {
  // As the crate: added tokens (their content, normalized for normalized ones) and model tokens
  // go through the decoder together; special ones are left out when skipping.
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* added = parts_.added->FindById(id)) {
      if (!(skip_special_tokens && added->skipped_as_special)) tokens.push_back(added->decoded);
    } else if (const std::string* token = parts_.model->IdToToken(id)) {
      tokens.push_back(*token);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", id, " is not in the vocabulary (size ", vocab_size_, ")"));
    }
  }
  if (parts_.decoder == nullptr) return absl::StrJoin(tokens, " ");
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> pieces, parts_.decoder->Decode(std::move(tokens)));
  return absl::StrJoin(pieces, "");
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path.string()));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path.string()));
  return std::move(contents).str();
}

// The file's contents, or "" when it does not exist.
absl::StatusOr<std::string> ReadOptionalFile(const std::filesystem::path& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) return std::string();
  return ReadFile(path);
}

absl::StatusOr<std::unique_ptr<TokenizerImpl>> MakeImpl(TokenizerParts parts,
                                                        TokenizerConfig config,
                                                        absl::string_view generation_config) {
  KILN_ASSIGN_OR_RETURN(std::vector<int32_t> eos_ids,
                        tokenizer_internal::ParseGenerationConfigEos(generation_config));
  return TokenizerImpl::Create(std::move(parts), config, std::move(eos_ids));
}

// GPT-2's tokenizer_config.json defaults: <|endoftext|> is bos, eos and unk.
TokenizerConfig Gpt2Defaults() {
  TokenizerConfig config;
  config.bos_token = config.eos_token = config.unk_token = "<|endoftext|>";
  return config;
}

}  // namespace

Tokenizer::Tokenizer(std::unique_ptr<TokenizerImpl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromTokenizerJson(
    absl::string_view tokenizer_json, absl::string_view tokenizer_config_json,
    absl::string_view generation_config_json) {
  KILN_ASSIGN_OR_RETURN(TokenizerParts parts,
                        tokenizer_internal::ParseTokenizerJson(tokenizer_json));
  KILN_ASSIGN_OR_RETURN(TokenizerConfig config,
                        tokenizer_internal::ParseTokenizerConfig(tokenizer_config_json));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TokenizerImpl> impl,
                        MakeImpl(std::move(parts), std::move(config), generation_config_json));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGpt2Files(absl::string_view encoder_json,
                                                                    absl::string_view vocab_bpe) {
  KILN_ASSIGN_OR_RETURN(TokenizerParts parts,
                        tokenizer_internal::ParseGpt2Files(encoder_json, vocab_bpe));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<TokenizerImpl> impl,
                        MakeImpl(std::move(parts), Gpt2Defaults(), ""));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(
    const std::filesystem::path& dir) {
  std::map<std::string, std::string> files;
  for (absl::string_view name : {"tokenizer.json", "tokenizer_config.json",
                                 "generation_config.json", "encoder.json", "vocab.bpe"}) {
    KILN_ASSIGN_OR_RETURN(std::string text, ReadOptionalFile(dir / std::string(name)));
    if (!text.empty()) files.emplace(std::string(name), std::move(text));
  }
  return FromFiles(files, dir.string());
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFiles(
    const std::map<std::string, std::string>& files, absl::string_view where) {
  auto text_of = [&](const char* name) -> absl::string_view {
    auto it = files.find(name);
    return it == files.end() ? absl::string_view() : absl::string_view(it->second);
  };
  auto named = [&](const char* name) { return absl::StrCat(where, "/", name); };
  const absl::string_view config_text = text_of("tokenizer_config.json");
  const absl::string_view generation_text = text_of("generation_config.json");
  absl::StatusOr<TokenizerConfig> config = tokenizer_internal::ParseTokenizerConfig(config_text);
  if (!config.ok()) return KilnAnnotate(config.status(), named("tokenizer_config.json"));
  if (files.count("tokenizer.json") > 0) {
    absl::StatusOr<TokenizerParts> parts =
        tokenizer_internal::ParseTokenizerJson(text_of("tokenizer.json"));
    if (!parts.ok()) return KilnAnnotate(parts.status(), named("tokenizer.json"));
    absl::StatusOr<std::unique_ptr<TokenizerImpl>> impl =
        MakeImpl(*std::move(parts), *std::move(config), generation_text);
    if (!impl.ok()) return KilnAnnotate(impl.status(), where);
    return std::unique_ptr<Tokenizer>(new Tokenizer(*std::move(impl)));
  }
  if (files.count("encoder.json") > 0 && files.count("vocab.bpe") > 0) {
    absl::StatusOr<TokenizerParts> parts =
        tokenizer_internal::ParseGpt2Files(text_of("encoder.json"), text_of("vocab.bpe"));
    if (!parts.ok()) return KilnAnnotate(parts.status(), where);
    TokenizerConfig defaults = Gpt2Defaults();
    if (!config_text.empty()) {
      if (config->bos_token.has_value()) defaults.bos_token = config->bos_token;
      if (config->eos_token.has_value()) defaults.eos_token = config->eos_token;
      if (config->unk_token.has_value()) defaults.unk_token = config->unk_token;
      defaults.pad_token = config->pad_token;
      defaults.add_bos_token = config->add_bos_token;
      defaults.add_eos_token = config->add_eos_token;
    }
    absl::StatusOr<std::unique_ptr<TokenizerImpl>> impl =
        MakeImpl(*std::move(parts), std::move(defaults), generation_text);
    if (!impl.ok()) return KilnAnnotate(impl.status(), where);
    return std::unique_ptr<Tokenizer>(new Tokenizer(*std::move(impl)));
  }
  return absl::NotFoundError(
      absl::StrCat("no tokenizer.json (nor encoder.json + vocab.bpe) in ", where));
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(absl::string_view text,
                                                       bool add_special_tokens) const {
  return impl_->Encode(text, add_special_tokens);
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              bool skip_special_tokens) const {
  KILN_ASSIGN_OR_RETURN(std::string bytes, impl_->DecodeBytes(ids, skip_special_tokens));
  return tokenizer_internal::ToValidUtf8(bytes);
}

absl::StatusOr<std::string> Tokenizer::DecodeBytes(std::span<const int32_t> ids,
                                                   bool skip_special_tokens) const {
  return impl_->DecodeBytes(ids, skip_special_tokens);
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size(); }

std::optional<int32_t> Tokenizer::TokenToId(absl::string_view token) const {
  return impl_->TokenToId(token);
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  const std::string* token = impl_->IdToToken(id);
  if (token == nullptr) return std::nullopt;
  return *token;
}

bool Tokenizer::IsSpecial(int32_t id) const { return impl_->IsSpecial(id); }

const SpecialTokenIds& Tokenizer::special_tokens() const { return impl_->special_tokens(); }

}  // namespace kiln
