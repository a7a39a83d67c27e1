// Tensorizer reader against the fixtures written by the real tensorizer 2.11.1
// (tests/data/tensorizer/README.md): every tensor's layout and plaintext against manifest.json,
// the edge-case values, and decryption with passphrases and raw keys.
#include "loaders/tensorizer_reader.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"
#include "loaders/tensorizer_crypto.h"
#include "nlohmann/json.hpp"
#include "tests/loaders/test_util.h"

namespace kiln::tensorizer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing_util::ReadBytes;
using testing_util::Sha256Hex;

const fs::path kDir = fs::path(KILN_TEST_DATA_DIR) / "tensorizer";
constexpr char kPassphrase[] = "tensorizer-fixture-passphrase";
constexpr char kDerivedKeyHex[] =
    "63693b1dfaac2334aab8f73608e284ee2450d49f6c7dd34ad8cd8aa5ea6e81e0";

const json& Manifest() {
  static const json* manifest = new json(json::parse(ReadBytes(kDir / "manifest.json")));
  return *manifest;
}

// A manifest name: a string, or a JSON path list written as 0x1E + compact JSON (§8).
std::string RawName(const json& name) {
  return name.is_string() ? name.get<std::string>() : "\x1e" + name.dump();
}

std::string Text(const TensorBytes& b) {
  return std::string(reinterpret_cast<const char*>(b.data), b.size);
}

// The key each fixture needs, if any.
std::optional<DecryptionKey> KeyFor(const std::string& file) {
  if (file == "llama_tiny_hf_fp16_encrypted_passphrase.tensors") {
    return DecryptionKey::FromPassphrase(kPassphrase);
  }
  if (file == "edge_cases_encrypted_rawkey.tensors") {
    return DecryptionKey::FromRawKey(ReadBytes(kDir / "edge_cases_encrypted_rawkey.key"));
  }
  return std::nullopt;
}

absl::StatusOr<std::vector<TensorBytes>> ReadWith(const TensorizerFile& file,
                                                  std::optional<DecryptionKey> key,
                                                  HashCheck check = HashCheck::kAll,
                                                  int threads = 0) {
  ReadOptions options;
  options.key = std::move(key);
  options.hash_check = check;
  options.threads = threads;
  return file.ReadAll(options);
}

class TensorizerFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorizerFixtureTest, LayoutAndPlaintextMatchManifest) {
  const std::string name = GetParam();
  const json& m = Manifest()["files"][name];
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / name);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->version(), m["data_version"].get<uint32_t>());
  EXPECT_EQ(file->file_size(), m["file_size"].get<uint64_t>());
  EXPECT_EQ(file->has_crypt_info(),
            file->version() == 3 || (file->version() == 4 && m["feature_flags"] == 1));
  const json& expected = m["tensors"];
  ASSERT_EQ(file->tensors().size(), expected.size());
  ASSERT_EQ(file->tensors().size(), m["tensor_count"].get<size_t>());

  bool any_encrypted = false;
  for (size_t i = 0; i < expected.size(); ++i) {
    const json& e = expected[i];
    const TensorInfo& t = file->tensors()[i];
    SCOPED_TRACE(absl::CHexEscape(t.name));
    EXPECT_EQ(t.name, RawName(e["name"]));
    EXPECT_EQ(file->Find(t.name), &t);
    const std::string type = e["type"];
    EXPECT_EQ(t.type, type == "PARAM"    ? TensorType::kParam
                      : type == "BUFFER" ? TensorType::kBuffer
                                         : TensorType::kStateDict);
    EXPECT_EQ(t.module_idx, e["module_idx"].get<int>());
    EXPECT_EQ(t.dtype_string, e["dtype_field"].get<std::string>());
    EXPECT_EQ("torch." + std::string(ElementTypeName(t.element_type)),
              e["torch_dtype"].get<std::string>());
    EXPECT_EQ(t.shape, e["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.header_offset, e["header_offset"].get<uint64_t>());
    EXPECT_EQ(t.data_offset - t.header_offset, e["header_size"].get<uint64_t>());
    EXPECT_EQ(t.data_offset, e["data_offset"].get<uint64_t>());
    EXPECT_EQ(t.data_length, e["data_length"].get<uint64_t>());
    const auto hashes = e["hash_types"].get<std::vector<std::string>>();
    EXPECT_EQ(t.has_crc32, std::count(hashes.begin(), hashes.end(), "crc32") == 1);
    EXPECT_EQ(t.has_sha256, std::count(hashes.begin(), hashes.end(), "sha256") == 1);
    EXPECT_EQ(t.encrypted, e["encrypted_chunks"].get<int>() > 0);
    any_encrypted |= t.encrypted;
  }
  EXPECT_EQ(file->any_encrypted(), any_encrypted);

  absl::StatusOr<std::vector<TensorBytes>> bytes = ReadWith(*file, KeyFor(name));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_EQ(bytes->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const TensorInfo& t = file->tensors()[i];
    const TensorBytes& b = (*bytes)[i];
    SCOPED_TRACE(absl::CHexEscape(t.name));
    EXPECT_EQ(b.size, t.byte_size());
    EXPECT_EQ(Sha256Hex(b.data, b.size), expected[i]["plaintext_sha256"].get<std::string>());
    EXPECT_EQ(b.zero_copy, !t.encrypted && !t.meta);
    if (b.zero_copy) {
      // Plain records are views into the mapping at their data offset.
      EXPECT_EQ(Sha256Hex(b.data, b.size),
                Sha256Hex(ReadBytes(kDir / name).data() + t.data_offset, t.data_length));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(TensorizerFixtures, TensorizerFixtureTest,
                         ::testing::Values("llama_tiny_hf_fp32.tensors",
                                           "llama_tiny_hf_bf16.tensors",
                                           "llama_tiny_hf_fp16.tensors",
                                           "llama_tiny_hf_fp16_encrypted_passphrase.tensors",
                                           "llama_tiny_vllm_bf16.tensors", "edge_cases.tensors",
                                           "edge_cases_encrypted_rawkey.tensors"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string out;
                           for (char c : info.param.substr(0, info.param.find('.'))) {
                             out.push_back(std::isalnum(static_cast<unsigned char>(c)) ? c : '_');
                           }
                           return out;
                         });

TEST(TensorizerReaderTest, VersionsAndFlagsAsTheReadmeSays) {
  struct Case {
    const char* file;
    uint32_t version;
    bool crypt_info;
    bool encrypted;
  };
  for (const Case& c : {Case{"llama_tiny_hf_fp32.tensors", 1, false, false},
                        Case{"llama_tiny_hf_fp16.tensors", 1, false, false},
                        Case{"llama_tiny_hf_bf16.tensors", 2, false, false},
                        Case{"llama_tiny_hf_fp16_encrypted_passphrase.tensors", 3, true, true},
                        Case{"edge_cases_encrypted_rawkey.tensors", 4, true, true},
                        Case{"llama_tiny_vllm_bf16.tensors", 4, false, false},
                        Case{"edge_cases.tensors", 4, false, false}}) {
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / c.file);
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->version(), c.version) << c.file;
    EXPECT_EQ(file->has_crypt_info(), c.crypt_info) << c.file;
    EXPECT_EQ(file->any_encrypted(), c.encrypted) << c.file;
    EXPECT_EQ(file->tensors().front().header_offset, 262217u) << c.file;
  }
}

class TensorizerEdgeCasesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / "edge_cases.tensors");
    ASSERT_TRUE(file.ok()) << file.status();
    file_.emplace(*std::move(file));
    absl::StatusOr<std::vector<TensorBytes>> bytes = ReadWith(*file_, std::nullopt);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    bytes_ = *std::move(bytes);
  }
  const TensorInfo& Info(const std::string& name) {
    const TensorInfo* info = file_->Find(name);
    EXPECT_NE(info, nullptr) << absl::CHexEscape(name);
    static const TensorInfo kMissing;
    return info != nullptr ? *info : kMissing;
  }
  const TensorBytes& Bytes(const std::string& name) {
    const TensorInfo* info = file_->Find(name);
    static const TensorBytes kNone;
    if (info == nullptr) return kNone;
    return bytes_[static_cast<size_t>(info - file_->tensors().data())];
  }
  template <typename T>
  std::vector<T> Values(const std::string& name) {
    const TensorBytes& b = Bytes(name);
    std::vector<T> out(b.size / sizeof(T));
    if (!out.empty()) std::memcpy(out.data(), b.data, out.size() * sizeof(T));  // unaligned source
    return out;
  }
  std::optional<TensorizerFile> file_;
  std::vector<TensorBytes> bytes_;
};

TEST_F(TensorizerEdgeCasesTest, DtypesParseToTheirElementTypes) {
  const std::pair<const char*, ElementType> cases[] = {
      {"f32", ElementType::kF32},         {"f64", ElementType::kF64},
      {"f16", ElementType::kF16},         {"bf16", ElementType::kBF16},
      {"c64", ElementType::kC64},         {"c128", ElementType::kC128},
      {"i8", ElementType::kI8},           {"u8", ElementType::kU8},
      {"i16", ElementType::kI16},         {"i32", ElementType::kI32},
      {"i64", ElementType::kI64},         {"bool", ElementType::kBool},
      {"c32", ElementType::kC32},         {"scalar_f32", ElementType::kF32},
      {"meta_f16_4x8", ElementType::kF16}};
  for (const auto& [name, type] : cases) {
    EXPECT_EQ(Info(name).element_type, type) << name;
    EXPECT_EQ(Bytes(name).size, Info(name).byte_size()) << name;
  }
  EXPECT_EQ(Info("bf16").dtype_string, std::string("<V2\0torch.bfloat16", 18));
  EXPECT_EQ(Info("c32").dtype_string, std::string("<V4\0torch.complex32", 19));
}

TEST_F(TensorizerEdgeCasesTest, ScalarIsZeroDimensionalWithOneElement) {
  const TensorInfo& t = Info("scalar_f32");
  EXPECT_TRUE(t.shape.empty());
  EXPECT_EQ(t.elements, 1);
  EXPECT_EQ(Values<float>("scalar_f32"), std::vector<float>{3.5f});
}

TEST_F(TensorizerEdgeCasesTest, EmptyTensorHasNoBytesAndIsNotMeta) {
  const TensorInfo& t = Info("empty_f32_0x3");
  EXPECT_EQ(t.shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(t.elements, 0);
  EXPECT_FALSE(t.meta);
  EXPECT_EQ(Bytes("empty_f32_0x3").size, 0u);
}

TEST_F(TensorizerEdgeCasesTest, MetaTensorReadsAsZeros) {
  const TensorInfo& t = Info("meta_f16_4x8");
  EXPECT_TRUE(t.meta);
  EXPECT_EQ(t.data_length, 0u);
  const TensorBytes& b = Bytes("meta_f16_4x8");
  ASSERT_EQ(b.size, 64u);
  EXPECT_FALSE(b.zero_copy);
  EXPECT_EQ(Text(b), std::string(64, '\0'));
}

TEST_F(TensorizerEdgeCasesTest, NonContiguousSourceIsStoredRowMajor) {
  EXPECT_EQ(Info("noncontig_f32_T").shape, (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(Values<float>("noncontig_f32_T"),
            (std::vector<float>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
}

TEST_F(TensorizerEdgeCasesTest, IntegerExtremes) {
  const std::vector<int8_t> i8 = Values<int8_t>("i8");
  EXPECT_NE(std::find(i8.begin(), i8.end(), int8_t{-128}), i8.end());
  EXPECT_NE(std::find(i8.begin(), i8.end(), int8_t{127}), i8.end());
  const std::vector<int64_t> i64 = Values<int64_t>("i64");
  EXPECT_NE(std::find(i64.begin(), i64.end(), std::numeric_limits<int64_t>::min()), i64.end());
  EXPECT_NE(std::find(i64.begin(), i64.end(), std::numeric_limits<int64_t>::max()), i64.end());
  for (uint8_t v : Values<uint8_t>("bool")) EXPECT_LE(v, 1);
}

TEST_F(TensorizerEdgeCasesTest, UnicodeAndJsonPathNamesAreExact) {
  EXPECT_NE(file_->Find("unicode_\xe5\x90\x8d\xe5\x89\x8d"), nullptr);
  EXPECT_EQ(Values<int32_t>("\x1e[\"nested\",\"list\",0]").size(), 2u);
  EXPECT_EQ(Values<int32_t>("\x1e[\"nested\",\"list\",1]").size(), 1u);
  EXPECT_EQ(Info("\x1e[\"nested\",\"dict\",\"a.b\"]").element_type, ElementType::kF32);
  // No normalization: names match only byte for byte.
  EXPECT_EQ(file_->Find("[\"nested\",\"list\",0]"), nullptr);
  EXPECT_EQ(file_->Find("nested.list.0"), nullptr);
  EXPECT_EQ(file_->Find("missing"), nullptr);
}

TEST(TensorizerReaderTest, VllmMarkerIsAMetaParam) {
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / "llama_tiny_vllm_bf16.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo* marker = file->Find(".vllm_tensorized_marker");
  ASSERT_NE(marker, nullptr);
  EXPECT_EQ(marker, &file->tensors().front());
  EXPECT_EQ(marker->type, TensorType::kParam);
  EXPECT_EQ(marker->module_idx, 0);
  EXPECT_EQ(marker->dtype_string, "<i8");
  EXPECT_EQ(marker->shape, std::vector<int64_t>{1});
  EXPECT_TRUE(marker->meta);
  EXPECT_EQ(file->Find("model.layers.0.self_attn.rotary_emb.cos_sin_cache")->type,
            TensorType::kBuffer);
}

TEST(TensorizerReaderTest, HashCheckOffAndThreadCountsGiveTheSameBytes) {
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / "llama_tiny_hf_bf16.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<std::vector<TensorBytes>> a = ReadWith(*file, std::nullopt, HashCheck::kAll, 1);
  absl::StatusOr<std::vector<TensorBytes>> b = ReadWith(*file, std::nullopt, HashCheck::kNone, 7);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ(Text((*a)[i]), Text((*b)[i]));
}

// Plaintext of every tensor of llama_tiny_hf_fp16.tensors, which the encrypted file holds too.
std::vector<std::string> Fp16Plaintext() {
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / "llama_tiny_hf_fp16.tensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  absl::StatusOr<std::vector<TensorBytes>> bytes = ReadWith(*file, std::nullopt);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  std::vector<std::string> out;
  for (const TensorBytes& b : *bytes) out.push_back(Text(b));
  return out;
}

class TensorizerEncryptedTest : public ::testing::Test {
 protected:
  static constexpr char kPassFile[] = "llama_tiny_hf_fp16_encrypted_passphrase.tensors";
  static constexpr char kRawFile[] = "edge_cases_encrypted_rawkey.tensors";
  absl::StatusOr<std::vector<TensorBytes>> Read(const char* name, std::optional<DecryptionKey> key,
                                                HashCheck check = HashCheck::kAll) {
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / name);
    if (!file.ok()) return file.status();
    file_.emplace(*std::move(file));
    return ReadWith(*file_, std::move(key), check);
  }
  std::optional<TensorizerFile> file_;
};

TEST_F(TensorizerEncryptedTest, PassphraseAndDerivedRawKeyGiveTheFp16Plaintext) {
  const std::vector<std::string> expected = Fp16Plaintext();
  ASSERT_EQ(expected.size(), 21u);
  for (bool passphrase : {true, false}) {
    SCOPED_TRACE(passphrase ? "passphrase" : "raw key");
    absl::StatusOr<std::vector<TensorBytes>> bytes = Read(
        kPassFile, passphrase ? DecryptionKey::FromPassphrase(kPassphrase)
                              : DecryptionKey::FromRawKey(absl::HexStringToBytes(kDerivedKeyHex)));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_EQ(bytes->size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_FALSE((*bytes)[i].zero_copy);
      EXPECT_EQ(Text((*bytes)[i]), expected[i]) << file_->tensors()[i].name;
    }
  }
}

TEST_F(TensorizerEncryptedTest, RawKeyFileDecryptsThreePieceTensor) {
  absl::StatusOr<std::vector<TensorBytes>> bytes = Read(
      kRawFile, DecryptionKey::FromRawKey(ReadBytes(kDir / "edge_cases_encrypted_rawkey.key")));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const TensorInfo* big = file_->Find("big_f32_3000");
  ASSERT_NE(big, nullptr);
  EXPECT_TRUE(big->encrypted);
  EXPECT_EQ(big->data_length, 12000u);
  const TensorInfo* meta = file_->Find("meta_f32_2x2");
  ASSERT_NE(meta, nullptr);
  EXPECT_FALSE(meta->encrypted);
  EXPECT_TRUE(meta->has_crc32);
  EXPECT_EQ(Text((*bytes)[3]), std::string(16, '\0'));
}

TEST_F(TensorizerEncryptedTest, MissingKeyIsFailedPrecondition) {
  for (const char* name : {kPassFile, kRawFile}) {
    absl::StatusOr<std::vector<TensorBytes>> bytes = Read(name, std::nullopt);
    ASSERT_FALSE(bytes.ok()) << name;
    EXPECT_EQ(bytes.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_CONTAINS(bytes.status().message(), "no decryption key");
    EXPECT_CONTAINS(bytes.status().message(), (kDir / name).string());
  }
}

TEST_F(TensorizerEncryptedTest, WrongRawKeyIsPermissionDenied) {
  std::string key = ReadBytes(kDir / "edge_cases_encrypted_rawkey.key");
  key[5] ^= 1;
  absl::StatusOr<std::vector<TensorBytes>> bytes = Read(kRawFile, DecryptionKey::FromRawKey(key));
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_CONTAINS(bytes.status().message(), "key is wrong");
  EXPECT_CONTAINS(bytes.status().message(), "tensor \"");
  // Hash checking off does not let a wrong key through: the MACs still fail.
  bytes = Read(kPassFile, DecryptionKey::FromRawKey(std::string(32, 'k')), HashCheck::kNone);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(TensorizerEncryptedTest, WrongPassphraseIsPermissionDenied) {
  absl::StatusOr<std::vector<TensorBytes>> bytes =
      Read(kPassFile, DecryptionKey::FromPassphrase("tensorizer-fixture-passphrasf"));
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_CONTAINS(bytes.status().message(), "passphrase is wrong");
  EXPECT_EQ(bytes.status().message().find("tensorizer-fixture-passphrasf"), std::string::npos);
}

TEST_F(TensorizerEncryptedTest, KeyOfTheWrongKindOrLength) {
  absl::StatusOr<std::vector<TensorBytes>> bytes =
      Read(kRawFile, DecryptionKey::FromPassphrase(kPassphrase));
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_CONTAINS(bytes.status().message(), "raw key");
  bytes = Read(kRawFile, DecryptionKey::FromRawKey(std::string(31, 'k')));
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(bytes.status().message(), "31 bytes");
}

TEST_F(TensorizerEncryptedTest, KeyForAnUnencryptedFileIsIgnored) {
  absl::StatusOr<std::vector<TensorBytes>> bytes =
      Read("edge_cases.tensors", DecryptionKey::FromPassphrase("unused"));
  EXPECT_TRUE(bytes.ok()) << bytes.status();
}

TEST_F(TensorizerEncryptedTest, OwnedBuffersOutliveTheFileWithKeepAlive) {
  absl::StatusOr<std::vector<TensorBytes>> bytes =
      Read(kPassFile, DecryptionKey::FromPassphrase(kPassphrase));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  std::shared_ptr<const void> keep = file_->keep_alive();
  file_.reset();
  // Decrypted buffers and mapping are still readable (ASan would flag a use after free).
  const std::vector<std::string> expected = Fp16Plaintext();
  ASSERT_EQ(bytes->size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(Text((*bytes)[i]), expected[i]);
}

TEST(TensorizerDTypeTest, EveryTypeRoundTripsThroughItsDTypeString) {
  for (int i = 0; i <= static_cast<int>(ElementType::kF8E8M0FNU); ++i) {
    const auto type = static_cast<ElementType>(i);
    absl::StatusOr<ElementType> parsed = ParseDTypeString(DTypeString(type));
    ASSERT_TRUE(parsed.ok()) << ElementTypeName(type) << ": " << parsed.status();
    EXPECT_EQ(*parsed, type) << ElementTypeName(type);
  }
  EXPECT_EQ(ElementTypeName(ElementType::kBF16), "bfloat16");
  EXPECT_EQ(ElementSize(ElementType::kC128), 16u);
  EXPECT_EQ(DTypeString(ElementType::kF8E4M3FN), std::string("|V1\0torch.float8_e4m3fn", 23));
}

TEST(TensorizerDTypeTest, BothUnsignedSpellingsAndRefusals) {
  EXPECT_EQ(*ParseDTypeString("<u2"), ElementType::kU16);
  EXPECT_EQ(*ParseDTypeString(std::string("<V2\0torch.uint16", 16)), ElementType::kU16);
  EXPECT_EQ(*ParseDTypeString(std::string("<V8\0torch.uint64", 16)), ElementType::kU64);
  for (const std::string& bad :
       {std::string(">f4"), std::string("<f3"), std::string(""), std::string("<V2"),
        std::string("<V4\0torch.bfloat16", 18), std::string("|V2\0torch.bfloat16", 18),
        std::string("<V2\0bfloat16", 11), std::string("|V1\0torch.qint8", 15),
        std::string("<V2\0torch.", 10)}) {
    EXPECT_FALSE(ParseDTypeString(bad).ok()) << absl::CHexEscape(bad);
  }
}

// Bit-at-a-time IEEE CRC-32, the definition the fast path must reproduce.
uint32_t ReferenceCrc32(uint32_t crc, const std::string& data) {
  crc = ~crc;
  for (unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1)));
  }
  return ~crc;
}

TEST(TensorizerHashTest, Crc32MatchesTheDefinitionAtEveryLengthAndOffset) {
  std::string data(1 << 16, '\0');
  uint64_t x = 0x9E3779B97F4A7C15u;
  for (char& c : data) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  auto crc = [](uint32_t start, const std::string& s) {
    return Crc32(start, {reinterpret_cast<const std::byte*>(s.data()), s.size()});
  };
  EXPECT_EQ(crc(0, "123456789"), 0xCBF43926u);  // the standard check value
  for (size_t offset = 0; offset < 4; ++offset) {
    for (size_t len = 0; len <= 300; ++len) {
      const std::string piece = data.substr(offset, len);
      ASSERT_EQ(crc(0, piece), ReferenceCrc32(0, piece)) << offset << " " << len;
    }
  }
  const std::string tail = data.substr(3);
  EXPECT_EQ(crc(0, tail), ReferenceCrc32(0, tail));
  // Continuing from a previous value equals hashing the concatenation.
  EXPECT_EQ(crc(crc(0, data.substr(0, 1000)), data.substr(1000)), crc(0, data));
}

TEST(TensorizerCryptoTest, ChunkNonceIsRepeatedLittleEndianIncrement) {
  Nonce initial{};
  for (size_t i = 0; i < initial.size(); ++i) initial[i] = static_cast<uint8_t>(0xF0 + i);
  initial[0] = 0xFE;  // carries out of the first bytes within a few steps
  initial[1] = 0xFF;
  Nonce stepped = initial;
  for (uint64_t i = 0; i < 600; ++i) {
    ASSERT_EQ(ChunkNonce(initial, i), stepped) << i;
    IncrementNonce(stepped);
  }
  Nonce all_ones;
  all_ones.fill(0xFF);
  EXPECT_EQ(ChunkNonce(all_ones, 1), Nonce{});  // wraps like sodium_increment
}

TEST(TensorizerCryptoTest, DecryptionKeyMovesKeepTheSecret) {
  DecryptionKey a = DecryptionKey::FromPassphrase("secret words");
  DecryptionKey b = std::move(a);
  ASSERT_EQ(b.secret().size(), 12u);
  EXPECT_EQ(std::string(b.secret().begin(), b.secret().end()), "secret words");
  EXPECT_TRUE(b.is_passphrase());
  EXPECT_FALSE(DecryptionKey::FromRawKey(std::string(32, 'x')).is_passphrase());
}

}  // namespace
}  // namespace kiln::tensorizer
