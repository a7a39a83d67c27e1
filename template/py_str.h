// Python string semantics and argument helpers shared by the builtins (internal to template/).
// Case mapping is ASCII only; stripping and splitting use Python's Unicode whitespace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "template/value.h"

namespace kiln::jinja {

absl::Status ArgError(absl::string_view fn, absl::string_view msg);

// str(v), without copying through ToStr for strings.
std::string Str(const Value& v);
std::string Upper(std::string s);
std::string Lower(std::string s);
std::string Capitalize(const std::string& s);
// str.strip/lstrip/rstrip: `chars` null (or None) strips whitespace.
std::string Strip(const std::string& s, const Value* chars, bool left, bool right);
// str.replace; count < 0 replaces all.
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                    int64_t count);
// str.split: `sep` null (or None) splits on runs of whitespace; maxsplit < 0 is unlimited.
List Split(const std::string& s, const Value* sep, int64_t maxsplit);
// Jinja's title filter and Python's str.title.
std::string JinjaTitle(const std::string& s);
std::string PyTitle(const std::string& s);
// str.splitlines for \n, \r\n and \r.
std::vector<std::string> Lines(const std::string& s);
std::string HtmlEscape(const std::string& s);

// Attribute lookup as selectattr/map/sort do: dotted paths, integer parts index lists.
Value AttrPath(const Value& v, const std::string& path);
// The arguments without the first n positional ones.
CallArgs Shift(const CallArgs& args, size_t n);
int64_t IntArg(const CallArgs& args, size_t pos, absl::string_view name, int64_t def);
bool BoolArg(const CallArgs& args, size_t pos, absl::string_view name, bool def);

}  // namespace kiln::jinja
