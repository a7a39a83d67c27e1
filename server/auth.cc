#include "server/auth.h"

#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace kiln {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `a` is visited whatever `b` holds; the length difference is folded in.
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    const unsigned char other = b.empty() ? 0 : static_cast<unsigned char>(b[i % b.size()]);
    diff = diff | (static_cast<unsigned char>(a[i]) ^ other);
  }
  return diff == 0;
}

absl::StatusOr<std::string> ReadAdminTokenFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(what, " ", path, " cannot be read"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", path, " is empty"));
  }
  return token;
}

absl::Status CheckAdminToken(const grpc::ServerContext& context, absl::string_view expected) {
  if (expected.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "the Models service needs the admin token: send metadata 'authorization: Bearer <token>'");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() < kScheme.size() || !absl::StartsWithIgnoreCase(value, kScheme)) {
    return absl::UnauthenticatedError(
        "the authorization metadata must be 'Bearer <token>' (the admin token)");
  }
  const absl::string_view token = absl::StripAsciiWhitespace(value.substr(kScheme.size()));
  if (!ConstantTimeEquals(token, expected)) {
    return absl::PermissionDeniedError("the admin token does not match");
  }
  return absl::OkStatus();
}

}  // namespace kiln
