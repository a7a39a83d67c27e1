// Regex: PCRE2 (8-bit, UTF + UCP, JIT where available) with tokenizer.json's Oniguruma dialect.

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tokenizer/components.h"
#include "tokenizer/unicode_util.h"

namespace kiln::tokenizer_internal {
namespace {

// The Hugging Face crate compiles patterns with Oniguruma, whose Unicode classes differ a little
// from PCRE2's UCP ones: \s is White_Space (PCRE2 adds U+180E), \w is Letter|Mark|Number|Pc
// (PCRE2 has no marks and only "_" of Pc) and \h is a hex digit (PCRE2: horizontal space). The
// rewrite spells these out as explicit classes, and turns \uHHHH (Oniguruma) into \x{HHHH}.
// Oniguruma's default syntax also has Ruby's options: ^ and $ match at every line (compiled with
// PCRE2_MULTILINE) and the inline option (?m) means "dot matches newline" (PCRE2's (?s)).
constexpr absl::string_view kSpaceItems = "\\x{9}-\\x{d}\\x{85}\\p{Z}";
constexpr absl::string_view kWordItems = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr absl::string_view kHexItems = "0-9a-fA-F";

bool IsHexDigit(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

std::string TranslatePattern(absl::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  int class_depth = 0;  // > 0 inside [...] (Oniguruma allows nested classes)
  size_t i = 0;
  while (i < p.size()) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char d = p[i + 1];
      const bool in_class = class_depth > 0;
      absl::string_view items;
      bool negated = false;
      switch (d) {
        case 's':
        case 'S':
          items = kSpaceItems;
          negated = d == 'S';
          break;
        case 'w':
        case 'W':
          items = kWordItems;
          negated = d == 'W';
          break;
        case 'h':
        case 'H':
          items = kHexItems;
          negated = d == 'H';
          break;
        case 'Q': {  // literal text up to \E: copy as is
          const size_t stop = p.find("\\E", i + 2);
          const size_t end = stop == absl::string_view::npos ? p.size() : stop + 2;
          out.append(p.data() + i, end - i);
          i = end;
          continue;
        }
        case 'u':
          if (i + 5 < p.size() && IsHexDigit(p[i + 2]) && IsHexDigit(p[i + 3]) &&
              IsHexDigit(p[i + 4]) && IsHexDigit(p[i + 5])) {
            absl::StrAppend(&out, "\\x{", p.substr(i + 2, 4), "}");
            i += 6;
            continue;
          }
          break;
        default:
          break;
      }
      if (!items.empty() && !(in_class && negated)) {
        if (in_class) {
          out.append(items.data(), items.size());
        } else {
          absl::StrAppend(&out, negated ? "[^" : "[", items, "]");
        }
      } else {
        // A negated class inside [...] cannot be spelled out: PCRE2's own meaning is kept.
        out.append(p.data() + i, 2);
      }
      i += 2;
      continue;
    }
    if (c == '(' && class_depth == 0 && i + 1 < p.size() && p[i + 1] == '?') {
      // Inline options (?imx-imx) or (?imx-imx:...): Ruby's m is PCRE2's s.
      size_t j = i + 2;
      while (j < p.size() && (p[j] == 'i' || p[j] == 'm' || p[j] == 'x' || p[j] == '-')) ++j;
      if (j > i + 2 && j < p.size() && (p[j] == ')' || p[j] == ':')) {
        for (size_t k = i; k < j; ++k) out.push_back(p[k] == 'm' ? 's' : p[k]);
        i = j;
        continue;
      }
    }
    if (c == '[') {
      if (class_depth > 0 && i + 1 < p.size() && p[i + 1] == ':') {  // POSIX [:name:]
        const size_t stop = p.find(":]", i + 2);
        if (stop != absl::string_view::npos) {
          out.append(p.data() + i, stop + 2 - i);
          i = stop + 2;
          continue;
        }
      }
      ++class_depth;
      out.push_back(c);
      ++i;
      // A ']' right after '[' or '[^' is a literal.
      if (i < p.size() && p[i] == '^') out.push_back(p[i++]);
      if (i < p.size() && p[i] == ']') out.push_back(p[i++]);
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
    ++i;
  }
  return out;
}

struct CodeDeleter {
  void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct CompileContextDeleter {
  void operator()(pcre2_compile_context* context) const { pcre2_compile_context_free(context); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* context) const { pcre2_match_context_free(context); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* stack) const { pcre2_jit_stack_free(stack); }
};

// Per-thread match state: one ovector pair is all FindAll reads (a pattern with groups still
// reports the whole match there), and a JIT stack larger than the 32 KiB default.
struct ThreadState {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> match_data{
      pcre2_match_data_create(1, nullptr)};
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> jit_stack{
      pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr)};
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> context{
      pcre2_match_context_create(nullptr)};
  bool jit_allowed = true;  // SetRegexJitForTesting

  ThreadState() {
    if (context && jit_stack) pcre2_jit_stack_assign(context.get(), nullptr, jit_stack.get());
  }
};

ThreadState& GetThreadState() {
  thread_local ThreadState state;
  return state;
}

// The status for PCRE2 match error rc (< 0, not NOMATCH) of pattern.
absl::Status MatchError(absl::string_view pattern, int rc) {
  PCRE2_UCHAR message[256];
  std::string reason;
  if (pcre2_get_error_message(rc, message, sizeof(message)) < 0) {
    reason = absl::StrCat("PCRE2 error ", rc);
  } else {
    reason = reinterpret_cast<const char*>(message);
  }
  std::string text = absl::StrCat("regex '", pattern, "' failed to match: ", reason);
  switch (rc) {
    case PCRE2_ERROR_MATCHLIMIT:
    case PCRE2_ERROR_HEAPLIMIT:
    case PCRE2_ERROR_DEPTHLIMIT:
    case PCRE2_ERROR_NOMEMORY:
    case PCRE2_ERROR_JIT_STACKLIMIT:
      return absl::ResourceExhaustedError(std::move(text));
    default:
      return absl::InternalError(std::move(text));
  }
}

// Appends the matches in text (valid UTF-8), offset by base, to out.
absl::Status MatchValid(const pcre2_code* code, bool use_jit, absl::string_view pattern,
                        absl::string_view text, size_t base, ThreadState& state,
                        std::vector<std::pair<size_t, size_t>>& out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.match_data.get());
  size_t pos = 0;
  while (pos <= n) {
    int rc;
    if (use_jit) {
      rc = pcre2_jit_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK, state.match_data.get(),
                           state.context.get());
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        use_jit = false;  // fall back to the interpreter (heap frames) for this text
        continue;
      }
    } else {
      rc = pcre2_match(code, subject, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       state.match_data.get(), state.context.get());
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) return MatchError(pattern, rc);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end > start && end > pos) {
      out.emplace_back(base + start, base + end);
      pos = end;
    } else {
      // An empty match (skipped). Like Oniguruma's and Rust regex's iterators, the next search
      // starts one character further on.
      const size_t at = start > pos ? start : pos;
      if (at >= n) break;
      pos = at + Utf8CharLength(text.data() + at, text.data() + n);
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct Regex::Compiled {
  std::unique_ptr<pcre2_code, CodeDeleter> code;
  bool jit = false;
  std::string pattern;
};

Regex::~Regex() = default;

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Compile(absl::string_view pattern) {
  const std::string translated = TranslatePattern(pattern);
  std::unique_ptr<pcre2_compile_context, CompileContextDeleter> context(
      pcre2_compile_context_create(nullptr));
  if (context == nullptr) return absl::ResourceExhaustedError("regex: out of memory");
  pcre2_set_newline(context.get(), PCRE2_NEWLINE_LF);  // Oniguruma's lines end at \n only
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                   translated.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE,
                                   &error_code, &error_offset, context.get());
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("cannot compile regex '", pattern,
                                                   "': ", reinterpret_cast<const char*>(message),
                                                   " (at offset ", error_offset, ")"));
  }
  std::shared_ptr<Regex> regex(new Regex());
  regex->compiled_ = std::make_unique<Compiled>();
  regex->compiled_->code.reset(code);
  regex->compiled_->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  regex->compiled_->pattern = std::string(pattern);
  return std::shared_ptr<const Regex>(std::move(regex));
}

absl::StatusOr<std::vector<std::pair<size_t, size_t>>> Regex::FindAll(
    absl::string_view text) const {
  std::vector<std::pair<size_t, size_t>> matches;
  ThreadState& state = GetThreadState();
  if (!state.match_data || !state.context) {
    return absl::ResourceExhaustedError(
        absl::StrCat("regex '", compiled_->pattern, "': out of memory for match data"));
  }
  const bool use_jit = compiled_->jit && state.jit_allowed;
  // PCRE2 would re-check the whole subject's UTF-8 on every call; it is checked once here and
  // PCRE2 told not to. Text that is not valid UTF-8 (components normally never see any) is
  // matched stretch by stretch, the invalid bytes skipped.
  size_t start = 0;
  while (true) {
    const absl::string_view rest = text.substr(start);
    const std::optional<size_t> bad = FindInvalidUtf8(rest);
    const size_t valid = bad.has_value() ? *bad : rest.size();
    if (absl::Status status = MatchValid(compiled_->code.get(), use_jit, compiled_->pattern,
                                         rest.substr(0, valid), start, state, matches);
        !status.ok()) {
      return status;
    }
    if (!bad.has_value()) break;
    start += valid + 1;
  }
  return matches;
}

void SetRegexMatchLimitForTesting(uint32_t limit) {
  ThreadState& state = GetThreadState();
  if (!state.context) return;
  if (limit == 0) pcre2_config(PCRE2_CONFIG_MATCHLIMIT, &limit);
  pcre2_set_match_limit(state.context.get(), limit);
}

void SetRegexJitForTesting(bool enabled) { GetThreadState().jit_allowed = enabled; }

}  // namespace kiln::tokenizer_internal
