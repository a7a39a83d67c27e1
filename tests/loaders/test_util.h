// Helpers for the loader tests: scratch directories, raw file bytes, SHA-256.
#pragma once

#include <openssl/evp.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/string_view.h"
#include "gtest/gtest.h"

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_PRED_FORMAT2(::kiln::testing_util::ContainsPred, haystack, needle)

namespace kiln::testing_util {

// A fresh directory under the test temp dir, removed with everything in it at scope exit.
class ScratchDir {
 public:
  ScratchDir() {
    std::string templ = (std::filesystem::path(::testing::TempDir()) / "kiln_loaders_XXXXXX");
    std::vector<char> buffer(templ.begin(), templ.end());
    buffer.push_back('\0');
    const char* made = ::mkdtemp(buffer.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed for " << templ;
    path_ = std::filesystem::weakly_canonical(made != nullptr ? made : templ.c_str());
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// EXPECT_PRED_FORMAT2 predicate: `haystack` contains `needle`.
inline ::testing::AssertionResult ContainsPred(const char* haystack_expr, const char* needle_expr,
                                               absl::string_view haystack,
                                               absl::string_view needle) {
  if (haystack.find(needle) != absl::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << haystack_expr << " (\"" << haystack << "\") does not contain " << needle_expr << " (\""
         << needle << "\")";
}

inline void WriteBytes(const std::filesystem::path& path, std::string_view bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::string U64Le(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A safetensors file: 8-byte LE length of `header`, `header`, then `data`.
inline std::string Safetensors(std::string_view header, std::string_view data) {
  return U64Le(header.size()) + std::string(header) + std::string(data);
}

inline std::string Sha256Hex(const void* data, size_t size) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EXPECT_EQ(EVP_Digest(data, size, digest, &length, EVP_sha256(), nullptr), 1);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 0xf]);
  }
  return hex;
}

}  // namespace kiln::testing_util
