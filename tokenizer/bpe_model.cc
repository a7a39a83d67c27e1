#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <atomic>
#include <functional>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln::tokenizer_internal {

namespace {

// Results per pre-token, kept per thread (no locking on the hot path): each thread holds the
// caches of its few most recently used models, each map bounded and emptied when full.
class ThreadCaches {
 public:
  using Map = absl::flat_hash_map<std::string, absl::InlinedVector<int32_t, 4>>;
  // Pre-tokens this long or longer are not cached (the crate's MAX_LENGTH).
  static constexpr size_t kMaxKeyBytes = 256;
  static constexpr size_t kCapacity = 16384;

  static Map& For(uint64_t owner) {
    thread_local ThreadCaches caches;
    return caches.Find(owner);
  }

 private:
  struct Slot {
    uint64_t owner = 0;
    uint64_t last_use = 0;
    Map map;
  };
  Map& Find(uint64_t owner) {
    ++clock_;
    Slot* oldest = &slots_[0];
    for (Slot& slot : slots_) {
      if (slot.owner == owner) {
        slot.last_use = clock_;
        return slot.map;
      }
      if (slot.last_use < oldest->last_use) oldest = &slot;
    }
    oldest->owner = owner;
    oldest->last_use = clock_;
    oldest->map = Map();
    return oldest->map;
  }
  std::array<Slot, 4> slots_;
  uint64_t clock_ = 0;
};

std::atomic<uint64_t> next_cache_owner{1};

// Byte length of the UTF-8 sequence a lead byte starts (1 for a stray byte).
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// Whether `text` is exactly one well-formed UTF-8 character of at most three bytes.
inline bool IsOneBmpChar(absl::string_view text) {
  if (text.empty() || text.size() > 3) return false;
  const unsigned char lead = static_cast<unsigned char>(text[0]);
  if (text.size() == 1) return lead < 0x80;
  if (Utf8Length(lead) != text.size()) return false;
  for (size_t i = 1; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) return false;
  }
  return true;
}

// The code point of a one-character UTF-8 string (valid input).
inline char32_t DecodeChar(absl::string_view ch) {
  const unsigned char lead = static_cast<unsigned char>(ch[0]);
  switch (ch.size()) {
    case 1:
      return lead;
    case 2:
      return ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(ch[1]) & 0x3Fu);
    case 3:
      return ((lead & 0x0Fu) << 12) | ((static_cast<unsigned char>(ch[1]) & 0x3Fu) << 6) |
             (static_cast<unsigned char>(ch[2]) & 0x3Fu);
    default:
      return ((lead & 0x07u) << 18) | ((static_cast<unsigned char>(ch[1]) & 0x3Fu) << 12) |
             ((static_cast<unsigned char>(ch[2]) & 0x3Fu) << 6) |
             (static_cast<unsigned char>(ch[3]) & 0x3Fu);
  }
}

struct Symbol {
  int32_t id;
  int32_t prev;
  int32_t next;
  uint32_t len;  // bytes of the word covered; 0 once merged into its left neighbour
};

struct MergeCandidate {
  uint32_t rank;
  int32_t pos;
  int32_t new_id;
  // Lowest rank first, then leftmost: `std::push_heap` with this builds a min-heap.
  bool operator>(const MergeCandidate& other) const {
    return rank != other.rank ? rank > other.rank : pos > other.pos;
  }
};

constexpr int32_t kMaxId = 1 << 26;
// The id → token tables are dense, sized by the largest id. Real vocabularies number their
// tokens from 0 with few if any holes; more unused ids than this means a hostile file, which
// would otherwise make a few bytes of JSON allocate gigabytes.
constexpr int64_t kMaxUnusedIds = 1 << 16;

}  // namespace

BpeModel::~BpeModel() = default;

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Create(
    const std::vector<std::pair<absl::string_view, int32_t>>& vocab,
    const std::vector<std::pair<absl::string_view, absl::string_view>>& merges,
    BpeOptions options) {
  std::unique_ptr<BpeModel> model(new BpeModel());
  model->options_ = std::move(options);
  const BpeOptions& opts = model->options_;

  int32_t max_id = -1;
  for (const auto& [token, id] : vocab) {
    if (id < 0 || id >= kMaxId) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE vocab: token \"", token, "\" has id ", id, " out of range"));
    }
    max_id = std::max(max_id, id);
  }
  if (max_id >= static_cast<int64_t>(vocab.size()) + kMaxUnusedIds) {
    return absl::InvalidArgumentError(
        absl::StrCat("BPE vocab: id ", max_id, " is far past the ", vocab.size(),
                     " tokens of the vocabulary (at most ", kMaxUnusedIds, " ids may be unused)"));
  }
  model->vocab_.reserve(vocab.size());
  model->id_to_token_.resize(static_cast<size_t>(max_id + 1));
  model->has_token_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab) {
    model->vocab_.insert_or_assign(std::string(token), id);
    if (!model->has_token_[id]) {
      model->has_token_[id] = true;
      model->id_to_token_[id] = std::string(token);
    }
  }

  const size_t prefix_len = opts.continuing_subword_prefix.size();
  model->merges_.reserve(merges.size());
  std::string joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    // Named views, not a structured binding: clang before 16 cannot capture one in a lambda.
    const absl::string_view a = merges[rank].first;
    const absl::string_view b = merges[rank].second;
    auto describe = [&] { return absl::StrCat("BPE merge #", rank, " (\"", a, "\" \"", b, "\")"); };
    auto a_it = model->vocab_.find(a);
    if (a_it == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), ": token \"", a, "\" is not in the vocabulary"));
    }
    auto b_it = model->vocab_.find(b);
    if (b_it == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), ": token \"", b, "\" is not in the vocabulary"));
    }
    if (b.size() < prefix_len) {
      return absl::InvalidArgumentError(absl::StrCat(describe(),
                                                     ": shorter than continuing_subword_prefix \"",
                                                     opts.continuing_subword_prefix, "\""));
    }
    joined.assign(a.data(), a.size());
    joined.append(b.data() + prefix_len, b.size() - prefix_len);
    auto new_it = model->vocab_.find(joined);
    if (new_it == model->vocab_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(describe(), ": merged token \"", joined, "\" is not in the vocabulary"));
    }
    model->merges_.insert_or_assign(PairKey(a_it->second, b_it->second),
                                    MergeValue{static_cast<uint32_t>(rank), new_it->second});
  }

  model->all_byte_tokens_ = true;
  for (int byte = 0; byte < 256; ++byte) {
    auto it = model->vocab_.find(absl::StrFormat("<0x%02X>", byte));
    model->byte_tokens_[byte] = it == model->vocab_.end() ? -1 : it->second;
    if (it == model->vocab_.end()) model->all_byte_tokens_ = false;
  }
  if (opts.unk_token.has_value()) {
    auto it = model->vocab_.find(*opts.unk_token);
    if (it != model->vocab_.end()) model->unk_id_ = it->second;
  }
  if (opts.continuing_subword_prefix.empty() && opts.end_of_word_suffix.empty()) {
    model->char_ids_.assign(0x10000, -1);
    for (const auto& [token, id] : model->vocab_) {
      if (IsOneBmpChar(token)) model->char_ids_[DecodeChar(token)] = id;
    }
  }
  model->cache_owner_ = next_cache_owner.fetch_add(1);
  return model;
}

std::optional<int32_t> BpeModel::TokenToId(absl::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  if (id < 0 || id >= id_limit() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

absl::Status BpeModel::Tokenize(absl::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return absl::OkStatus();
  if (options_.ignore_merges) {
    auto it = vocab_.find(piece);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return absl::OkStatus();
    }
  }
  if (piece.size() >= ThreadCaches::kMaxKeyBytes) return MergeWord(piece, out);
  ThreadCaches::Map& cache = ThreadCaches::For(cache_owner_);
  if (auto it = cache.find(piece); it != cache.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return absl::OkStatus();
  }
  const size_t start = out.size();
  if (absl::Status status = MergeWord(piece, out); !status.ok()) return status;
  if (cache.size() >= ThreadCaches::kCapacity) cache.clear();
  cache.try_emplace(std::string(piece), out.begin() + static_cast<ptrdiff_t>(start), out.end());
  return absl::OkStatus();
}

absl::Status BpeModel::MergeWord(absl::string_view word, std::vector<int32_t>& out) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<MergeCandidate> heap;
  thread_local std::string scratch;
  symbols.clear();
  heap.clear();
  auto add = [](int32_t id, uint32_t len) {
    const int32_t index = static_cast<int32_t>(symbols.size());
    if (index > 0) symbols.back().next = index;
    symbols.push_back(Symbol{id, index - 1, -1, len});
  };

  const std::string& prefix = options_.continuing_subword_prefix;
  const std::string& suffix = options_.end_of_word_suffix;
  // A run of unknown characters waiting to become one <unk> (or several without fuse_unk).
  bool unk_pending = false;
  uint32_t unk_len = 0;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(Utf8Length(static_cast<unsigned char>(word[i])), word.size() - i);
    const bool is_first = i == 0;
    const bool is_last = i + n == word.size();
    absl::string_view key = word.substr(i, n);
    if ((!is_first && !prefix.empty()) || (is_last && !suffix.empty())) {
      scratch.clear();
      if (!is_first) scratch += prefix;
      scratch.append(key.data(), key.size());
      if (is_last) scratch += suffix;
      key = scratch;
    }
    i += n;
    int32_t id = -1;
    if (!char_ids_.empty() && n < 4 && (n > 1 || static_cast<unsigned char>(key[0]) < 0x80)) {
      const char32_t cp = DecodeChar(key);
      if (cp < char_ids_.size()) id = char_ids_[cp];
    } else if (auto it = vocab_.find(key); it != vocab_.end()) {
      id = it->second;
    }
    if (id >= 0) {
      if (unk_pending) {
        add(*unk_id_, unk_len);
        unk_pending = false;
      }
      add(id, static_cast<uint32_t>(n));
      continue;
    }
    if (options_.byte_fallback) {
      bool all_known = all_byte_tokens_;
      if (!all_known) {
        all_known = std::all_of(key.begin(), key.end(), [this](char c) {
          return byte_tokens_[static_cast<unsigned char>(c)] >= 0;
        });
      }
      if (all_known) {
        // As the crate: a pending <unk> is not flushed before the byte tokens.
        for (char c : key) add(byte_tokens_[static_cast<unsigned char>(c)], 1);
        continue;
      }
    }
    if (!options_.unk_token.has_value()) continue;  // dropped, as the crate does
    if (!unk_id_.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BPE: unk token \"", *options_.unk_token, "\" is not in the vocabulary"));
    }
    if (unk_pending && options_.fuse_unk) {
      unk_len += static_cast<uint32_t>(n);
    } else {
      if (unk_pending) add(*unk_id_, unk_len);
      unk_pending = true;
      unk_len = static_cast<uint32_t>(n);
    }
  }
  if (unk_pending) add(*unk_id_, unk_len);

  const auto cmp = std::greater<MergeCandidate>();
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    auto it = merges_.find(PairKey(symbols[i].id, symbols[i + 1].id));
    if (it != merges_.end()) {
      heap.push_back(MergeCandidate{it->second.rank, static_cast<int32_t>(i), it->second.new_id});
    }
  }
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const MergeCandidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (left.len == 0 || left.next < 0) continue;
    const int32_t right_pos = left.next;
    const Symbol right = symbols[right_pos];
    // Skip stale candidates: the pair must still be there and merge to the same token.
    auto current = merges_.find(PairKey(left.id, right.id));
    if (current == merges_.end() || current->second.new_id != top.new_id) continue;
    left.id = top.new_id;
    left.len += right.len;
    left.next = right.next;
    symbols[right_pos].len = 0;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) {
      auto it = merges_.find(PairKey(symbols[left.prev].id, left.id));
      if (it != merges_.end()) {
        heap.push_back(MergeCandidate{it->second.rank, left.prev, it->second.new_id});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
    if (left.next >= 0) {
      auto it = merges_.find(PairKey(left.id, symbols[left.next].id));
      if (it != merges_.end()) {
        heap.push_back(MergeCandidate{it->second.rank, top.pos, it->second.new_id});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.len != 0) out.push_back(symbol.id);
  }
  // A very long word (SentencePiece-style text has no pre-tokenizer) leaves big buffers behind.
  constexpr size_t kKeepCapacity = 1 << 16;
  if (symbols.capacity() > kKeepCapacity) std::vector<Symbol>().swap(symbols);
  if (heap.capacity() > kKeepCapacity) std::vector<MergeCandidate>().swap(heap);
  return absl::OkStatus();
}

}  // namespace kiln::tokenizer_internal
