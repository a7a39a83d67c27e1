// The hash-check modes of the Tensorizer reader (all, crc32, none): each detects damage to what it
// checks — in a tensor large enough that its CRC32 is computed in pieces (the first and the last
// piece, and across a piece boundary) and in a small one — and crc32 checks exactly the CRC32s:
// it accepts a file whose SHA-256 alone is wrong. Also the mode names.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loaders/tensorizer_format.h"
#include "loaders/tensorizer_reader.h"
#include "loaders/tensorizer_verify.h"
#include "loaders/tensorizer_writer.h"
#include "tests/loaders/test_util.h"

namespace kiln::tensorizer {
namespace {

namespace fs = std::filesystem;
using testing_util::ReadBytes;
using testing_util::ScratchDir;
using testing_util::WriteBytes;

const fs::path kDir = fs::path(KILN_TEST_DATA_DIR) / "tensorizer";

// The reader splits a CRC32 computed apart from its SHA-256 into 8 MiB pieces; this tensor has
// three (8 MiB, 8 MiB, 4 MiB + 3 bytes).
constexpr uint64_t kPiece = uint64_t{8} << 20;
constexpr uint64_t kBigBytes = 2 * kPiece + (uint64_t{4} << 20) + 3;

std::string Pattern(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i * 131 + i / 4093);
  return out;
}

// Opens `path` and reads every tensor, checking `check`; the first error, or OK.
absl::Status ReadAllWith(const fs::path& path, HashCheck check, int threads = 0) {
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(path);
  if (!file.ok()) return file.status();
  ReadOptions options;
  options.hash_check = check;
  options.threads = threads;
  return file->ReadAll(options).status();
}

// Where a record's stored CRC32 and SHA-256 are in the file.
struct StoredHashes {
  uint64_t crc32 = 0;
  uint64_t sha256 = 0;
};
StoredHashes HashOffsets(const std::string& bytes, const TensorInfo& t) {
  const std::span<const std::byte> header(
      reinterpret_cast<const std::byte*>(bytes.data()) + t.header_offset,
      t.data_offset - t.header_offset);
  absl::StatusOr<RecordHeader> record =
      ParseRecordHeader(header, /*has_crypt_info=*/false, t.name, FileErrors("test"));
  EXPECT_TRUE(record.ok()) << record.status();
  StoredHashes out;
  if (!record.ok()) return out;
  for (const HashField& field : record->hashes) {
    (field.type == HashType::kCrc32 ? out.crc32 : out.sha256) =
        t.header_offset + field.value_offset;
  }
  return out;
}

// Recomputes and stores the CRC32 of `t` from the bytes as they are now (after a flip), so that
// only its SHA-256 disagrees with its data.
void StoreMatchingCrc32(std::string& bytes, const TensorInfo& t) {
  const std::span<const std::byte> all(reinterpret_cast<const std::byte*>(bytes.data()),
                                       bytes.size());
  const std::span<const std::byte> header =
      all.subspan(t.header_offset, t.data_offset - t.header_offset);
  absl::StatusOr<RecordHeader> record =
      ParseRecordHeader(header, false, t.name, FileErrors("test"));
  ASSERT_TRUE(record.ok()) << record.status();
  absl::StatusOr<Digests> digests =
      ComputeDigests(header, record->hashes, 0, 0, all.subspan(t.data_offset, t.data_length),
                     /*want_crc32=*/true, /*want_sha256=*/false);
  ASSERT_TRUE(digests.ok()) << digests.status();
  std::string crc(4, '\0');
  std::memcpy(crc.data(), &digests->crc32, 4);
  bytes.replace(HashOffsets(bytes, t).crc32, 4, crc);
}

class TensorizerHashCheckTest : public ::testing::Test {
 protected:
  // "small" (f32 [3, 5]) then "big" (kBigBytes u8), both with CRC32 and SHA-256.
  void SetUp() override {
    const std::string small = Pattern(60), big = Pattern(kBigBytes);
    std::vector<WriteTensor> tensors(2);
    tensors[0].name = "small";
    tensors[0].element_type = ElementType::kF32;
    tensors[0].shape = {3, 5};
    tensors[0].data = reinterpret_cast<const std::byte*>(small.data());
    tensors[0].size = small.size();
    tensors[1].name = "big";
    tensors[1].element_type = ElementType::kU8;
    tensors[1].shape = {static_cast<int64_t>(kBigBytes)};
    tensors[1].data = reinterpret_cast<const std::byte*>(big.data());
    tensors[1].size = big.size();
    ASSERT_TRUE(WriteTensorizerFile(dir_ / "good.tensors", tensors).ok());
    good_ = ReadBytes(dir_ / "good.tensors");
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(dir_ / "good.tensors");
    ASSERT_TRUE(file.ok()) << file.status();
    small_ = file->tensors()[0];
    big_ = file->tensors()[1];
    ASSERT_EQ(big_.data_length, kBigBytes);
  }
  fs::path Write(const std::string& bytes) {
    WriteBytes(dir_ / "bad.tensors", bytes);
    return dir_ / "bad.tensors";
  }
  static void ExpectMismatch(const absl::Status& status, const std::string& tensor,
                             const std::string& hash) {
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_CONTAINS(status.message(), "bad.tensors");
    EXPECT_CONTAINS(status.message(), "tensor \"" + tensor + "\"");
    EXPECT_CONTAINS(status.message(), hash + " mismatch");
  }

  ScratchDir dir_;
  std::string good_;
  TensorInfo small_, big_;
};

TEST_F(TensorizerHashCheckTest, UnchangedFileReadsTheSameInEveryModeAndThreadCount) {
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(dir_ / "good.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32, HashCheck::kNone}) {
    for (int threads : {1, 2, 3}) {
      ReadOptions options;
      options.hash_check = check;
      options.threads = threads;
      absl::StatusOr<std::vector<TensorBytes>> bytes = file->ReadAll(options);
      ASSERT_TRUE(bytes.ok()) << HashCheckName(check) << " " << threads << ": " << bytes.status();
      ASSERT_EQ(bytes->size(), 2u);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>((*bytes)[1].data), (*bytes)[1].size),
                good_.substr(big_.data_offset, big_.data_length));
    }
  }
}

TEST_F(TensorizerHashCheckTest, FlipInAnyCrcPieceOrASmallTensorIsCaughtByEveryCheckingMode) {
  struct Flip {
    const TensorInfo* tensor;
    uint64_t at;  // into the tensor's data
  };
  const std::vector<Flip> flips = {{&big_, 0},
                                   {&big_, kPiece - 1},
                                   {&big_, kPiece},
                                   {&big_, kBigBytes / 2},
                                   {&big_, kBigBytes - 1},
                                   {&small_, 0},
                                   {&small_, 59}};
  for (const Flip& flip : flips) {
    SCOPED_TRACE(::testing::Message() << flip.tensor->name << " byte " << flip.at);
    std::string bad = good_;
    bad[flip.tensor->data_offset + flip.at] ^= 0x10;
    const fs::path path = Write(bad);
    // CRC32s are compared before SHA-256s (their order in the record), in every mode that
    // checks them; one thread computes the big CRC32 with its SHA-256, more split it.
    for (int threads : {1, 2, 3}) {
      ExpectMismatch(ReadAllWith(path, HashCheck::kAll, threads), flip.tensor->name, "CRC32");
      ExpectMismatch(ReadAllWith(path, HashCheck::kCrc32, threads), flip.tensor->name, "CRC32");
    }
    EXPECT_TRUE(ReadAllWith(path, HashCheck::kNone).ok());
  }
}

TEST_F(TensorizerHashCheckTest, WrongSha256AloneFailsAllButNotCrc32) {
  // Data flipped, then the stored CRC32 made right for it: only the SHA-256 pass can tell.
  for (uint64_t at : {uint64_t{0}, kBigBytes - 1}) {
    std::string bad = good_;
    bad[big_.data_offset + at] ^= 0x01;
    StoreMatchingCrc32(bad, big_);
    const fs::path path = Write(bad);
    for (int threads : {1, 2}) {
      ExpectMismatch(ReadAllWith(path, HashCheck::kAll, threads), "big", "SHA-256");
      EXPECT_TRUE(ReadAllWith(path, HashCheck::kCrc32, threads).ok()) << at;
    }
  }
}

TEST(TensorizerHashCheckFixtureTest, Crc32ModeChecksExactlyTheCrc32sOfARealTensorizerFile) {
  // Written by the Tensorizer library: every record has a CRC32 and a SHA-256. Stored hash
  // values are zeros in the hashed stream, so patching one leaves the other one right.
  const std::string good = ReadBytes(kDir / "llama_tiny_hf_fp32.tensors");
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / "llama_tiny_hf_fp32.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const TensorInfo* t = file->Find("lm_head.weight");
  ASSERT_NE(t, nullptr);
  ASSERT_TRUE(t->has_crc32 && t->has_sha256);
  const StoredHashes at = HashOffsets(good, *t);
  ScratchDir dir;
  const fs::path path = dir / "patched.tensors";

  std::string bad_sha = good;
  bad_sha[at.sha256 + 5] ^= 0x01;
  WriteBytes(path, bad_sha);
  EXPECT_TRUE(ReadAllWith(path, HashCheck::kCrc32).ok());
  absl::Status status = ReadAllWith(path, HashCheck::kAll);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_CONTAINS(status.message(), "tensor \"lm_head.weight\": SHA-256 mismatch");

  std::string bad_crc = good;
  bad_crc[at.crc32] ^= 0x01;
  WriteBytes(path, bad_crc);
  for (HashCheck check : {HashCheck::kCrc32, HashCheck::kAll}) {
    status = ReadAllWith(path, check);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_CONTAINS(status.message(), "tensor \"lm_head.weight\": CRC32 mismatch");
  }
  EXPECT_TRUE(ReadAllWith(path, HashCheck::kNone).ok());
}

TEST(TensorizerHashCheckFixtureTest, EncryptedRecordsCarryOnlySha256AndAreReadInEveryMode) {
  // Their MACs authenticate them; crc32 mode leaves their SHA-256 alone.
  const std::string key = ReadBytes(kDir / "edge_cases_encrypted_rawkey.key");
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32, HashCheck::kNone}) {
    absl::StatusOr<TensorizerFile> file =
        TensorizerFile::Open(kDir / "edge_cases_encrypted_rawkey.tensors");
    ASSERT_TRUE(file.ok()) << file.status();
    ReadOptions options;
    options.key = DecryptionKey::FromRawKey(key);
    options.hash_check = check;
    EXPECT_TRUE(file->ReadAll(options).ok()) << HashCheckName(check);
  }
}

// A record with a SHA-256 and no CRC32: crc32 mode checks its SHA-256 instead, so no plaintext
// goes unchecked, unless its MACs already authenticated it.
TEST(TensorizerVerifyTest, Crc32ModeFallsBackToSha256WhereARecordHasNoCrc32) {
  std::string header(48, 'h');
  const HashField sha{HashType::kSha256, 8, 32};
  const std::string data = Pattern(3000);
  const std::span<const std::byte> data_bytes(reinterpret_cast<const std::byte*>(data.data()),
                                              data.size());
  auto header_bytes = [&] {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(header.data()),
                                      header.size());
  };
  absl::StatusOr<Digests> digests =
      ComputeDigests(header_bytes(), {&sha, 1}, 0, 0, data_bytes, false, true);
  ASSERT_TRUE(digests.ok());
  header.replace(8, 32, reinterpret_cast<const char*>(digests->sha256.data()), 32);
  std::string damaged = data;
  damaged[2999] ^= 0x01;
  RecordToVerify record;
  record.name = "sha_only";
  record.header = header_bytes();
  record.hashes = {&sha, 1};
  record.size = data.size();
  const FileErrors err("f.tensors");
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32}) {
    record.data = reinterpret_cast<const std::byte*>(data.data());
    EXPECT_TRUE(VerifyRecordHashes({&record, 1}, {check, 2, -1}, err).ok());
    record.data = reinterpret_cast<const std::byte*>(damaged.data());
    const absl::Status status = VerifyRecordHashes({&record, 1}, {check, 2, -1}, err);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_CONTAINS(status.message(), "tensor \"sha_only\": SHA-256 mismatch");
  }
  record.authenticated = true;
  EXPECT_TRUE(VerifyRecordHashes({&record, 1}, {HashCheck::kCrc32, 2, -1}, err).ok());
  EXPECT_FALSE(VerifyRecordHashes({&record, 1}, {HashCheck::kAll, 2, -1}, err).ok());
  EXPECT_TRUE(VerifyRecordHashes({&record, 1}, {HashCheck::kNone, 2, -1}, err).ok());
}

TEST_F(TensorizerHashCheckTest, FileCutShortAfterOpenFailsTheCheckWithoutTouchingTheMapping) {
  // The data is read for hashing with read calls, so a file truncated under a load is a clear
  // error rather than a SIGBUS (the headers stay in the file: "big" is last).
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(dir_ / "good.tensors");
  ASSERT_TRUE(file.ok()) << file.status();
  fs::resize_file(dir_ / "good.tensors", big_.data_offset + kPiece + 100);
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32}) {
    ReadOptions options;
    options.hash_check = check;
    const absl::Status status = file->ReadAll(options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_CONTAINS(status.message(), "tensor \"big\"");
    EXPECT_CONTAINS(status.message(), "truncated");
  }
}

TEST(TensorizerHashCheckNameTest, NamesParseInAnyCaseAndOthersAreRefused) {
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32, HashCheck::kNone}) {
    absl::StatusOr<HashCheck> parsed = ParseHashCheck(HashCheckName(check));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, check);
  }
  EXPECT_EQ(HashCheckName(HashCheck::kCrc32), "crc32");
  EXPECT_EQ(ParseHashCheck("CRC32").value(), HashCheck::kCrc32);
  EXPECT_EQ(ParseHashCheck("All").value(), HashCheck::kAll);
  for (const char* bad : {"", "sha256", "crc", "crc32 ", "yes"}) {
    const absl::StatusOr<HashCheck> parsed = ParseHashCheck(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_CONTAINS(parsed.status().message(), std::string("\"") + bad + "\"");
    EXPECT_CONTAINS(parsed.status().message(), "\"all\"");
    EXPECT_CONTAINS(parsed.status().message(), "\"crc32\"");
    EXPECT_CONTAINS(parsed.status().message(), "\"none\"");
  }
}

}  // namespace
}  // namespace kiln::tensorizer
