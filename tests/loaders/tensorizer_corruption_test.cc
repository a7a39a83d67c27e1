// Tensorizer reader against damaged and crafted files: flipped bytes in every region, truncation
// at every record boundary, absurd counts and lengths, and hand-built crypt-info blocks. Each must
// give a clear error (never a crash or a huge allocation), naming the file and the tensor.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "loaders/tensorizer_crypto.h"
#include "loaders/tensorizer_reader.h"
#include "tests/loaders/test_util.h"

namespace kiln::tensorizer {
namespace {

namespace fs = std::filesystem;
using testing_util::ReadBytes;
using testing_util::ScratchDir;
using testing_util::U64Le;
using testing_util::WriteBytes;

const fs::path kDir = fs::path(KILN_TEST_DATA_DIR) / "tensorizer";
constexpr char kEdge[] = "edge_cases.tensors";
constexpr char kRaw[] = "edge_cases_encrypted_rawkey.tensors";
constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

void PutU64(std::string& s, size_t offset, uint64_t v) { s.replace(offset, 8, U64Le(v)); }
void PutU32(std::string& s, size_t offset, uint32_t v) {
  s.replace(offset, 4, U64Le(v).substr(0, 4));
}
void PutU16(std::string& s, size_t offset, uint16_t v) {
  s.replace(offset, 2, U64Le(v).substr(0, 2));
}

// Where each field of a tensor's index entry and record header lies in the file.
struct Layout {
  size_t entry = 0, entry_end = 0, entry_dims = 0, entry_header_offset = 0;
  size_t record = 0, record_name = 0, record_dims = 0, data = 0;
};

class TensorizerCorruptionTest : public ::testing::Test {
 protected:
  fs::path Path() const { return dir_ / "bad.tensors"; }
  static std::optional<DecryptionKey> RawKey() {
    return DecryptionKey::FromRawKey(ReadBytes(kDir / "edge_cases_encrypted_rawkey.key"));
  }
  // Writes `bytes`, opens them and reads every tensor; the first error, or OK.
  absl::Status OpenAndRead(const std::string& bytes, std::optional<DecryptionKey> key = {},
                           HashCheck check = HashCheck::kAll) {
    WriteBytes(Path(), bytes);
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(Path());
    if (!file.ok()) return file.status();
    ReadOptions options;
    options.key = std::move(key);
    options.hash_check = check;
    return file->ReadAll(options).status();
  }
  absl::Status OpenOnly(const std::string& bytes) {
    WriteBytes(Path(), bytes);
    return TensorizerFile::Open(Path()).status();
  }
  void ExpectError(const absl::Status& status, absl::StatusCode code,
                   const std::vector<std::string>& parts = {}) {
    ASSERT_FALSE(status.ok());
    EXPECT_EQ(status.code(), code) << status;
    EXPECT_CONTAINS(status.message(), Path().string());
    for (const std::string& part : parts) EXPECT_CONTAINS(status.message(), part);
  }
  // Field offsets of every tensor of a valid fixture, from what the reader reports.
  static std::vector<Layout> Layouts(const char* fixture) {
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / fixture);
    EXPECT_TRUE(file.ok()) << file.status();
    std::vector<Layout> out;
    if (!file.ok()) return out;
    size_t pos = kFileHeaderSize;
    for (const TensorInfo& t : file->tensors()) {
      Layout l;
      l.entry = pos;
      l.entry_dims = pos + 2 + t.name.size() + 1 + 1 + t.dtype_string.size() + 1;
      l.entry_header_offset = l.entry_dims + 4 * t.shape.size();
      l.entry_end = pos = l.entry_header_offset + 24;
      l.record = t.header_offset;
      l.record_name = t.header_offset + 13;
      l.record_dims = l.record_name + t.name.size() + 1 + t.dtype_string.size() + 1;
      l.data = t.data_offset;
      out.push_back(l);
    }
    return out;
  }
  ScratchDir dir_;
};

TEST_F(TensorizerCorruptionTest, UnchangedFixturesRead) {
  EXPECT_TRUE(OpenAndRead(ReadBytes(kDir / kEdge)).ok());
  EXPECT_TRUE(OpenAndRead(ReadBytes(kDir / kRaw), RawKey()).ok());
}

TEST_F(TensorizerCorruptionTest, FileHeaderMagicAndVersion) {
  const std::string good = ReadBytes(kDir / kEdge);
  for (size_t i = 0; i < 5; ++i) {
    std::string bad = good;
    bad[i] ^= 0x20;
    ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"magic"});
  }
  for (uint32_t version : {0u, 5u, 0xFFFFFFFFu}) {
    std::string bad = good;
    PutU32(bad, 5, version);
    ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"data version"});
  }
  // Versions 1-3 lack features this file uses (meta tensors; 3 adds crypt info it lacks).
  for (uint32_t version : {1u, 2u, 3u}) {
    std::string bad = good;
    PutU32(bad, 5, version);
    EXPECT_FALSE(OpenOnly(bad).ok()) << version;
  }
  std::string bf16 = ReadBytes(kDir / "llama_tiny_hf_bf16.tensors");
  PutU32(bf16, 5, 1);
  ExpectError(OpenOnly(bf16), absl::StatusCode::kInvalidArgument, {"opaque dtype", "version 1"});
}

TEST_F(TensorizerCorruptionTest, UnknownFlagBitsAndTheCryptInfoRule) {
  for (size_t byte : {9u, 10u, 40u}) {
    std::string bad = ReadBytes(kDir / kEdge);
    bad[byte] |= byte == 9 ? 0x02 : 0x80;
    ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"flag"});
  }
  // Clearing the encrypted bit of a v4 file: its records carry crypt info the reader no longer
  // expects, so their headers do not parse.
  std::string raw = ReadBytes(kDir / kRaw);
  raw[9] = 0;
  ExpectError(OpenOnly(raw), absl::StatusCode::kInvalidArgument, {"tensor \"small_f32\""});
  // Setting it on an unencrypted v4 file: crypt info is expected but absent.
  std::string edge = ReadBytes(kDir / kEdge);
  edge[9] = 1;
  ExpectError(OpenOnly(edge), absl::StatusCode::kInvalidArgument, {"tensor \"f32\""});
  // In versions 1-3 the field is an unused reserved slot and is ignored.
  std::string v1 = ReadBytes(kDir / "llama_tiny_hf_fp32.tensors");
  v1[9] = 0x7F;
  v1[40] = 0x01;
  EXPECT_TRUE(OpenAndRead(v1).ok());
}

TEST_F(TensorizerCorruptionTest, TensorCountAndIndexLength) {
  const std::string good = ReadBytes(kDir / kEdge);
  for (uint64_t count : {uint64_t{1} << 60, kMax, uint64_t{262144 / 29 + 1}}) {
    std::string bad = good;
    PutU64(bad, 57, count);
    ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"tensor_count"});
  }
  for (uint64_t count : {0u, 20u, 22u}) {  // the file has 21
    std::string bad = good;
    PutU64(bad, 57, count);
    EXPECT_FALSE(OpenOnly(bad).ok()) << count;
  }
  for (uint64_t m : {uint64_t{good.size()}, uint64_t{good.size() - 72}, kMax}) {
    std::string bad = good;
    PutU64(bad, 65, m);
    ExpectError(OpenOnly(bad), absl::StatusCode::kDataLoss, {"index length"});
  }
  for (uint64_t m : {uint64_t{0}, uint64_t{100}, uint64_t{262144 - 1}}) {
    std::string bad = good;
    PutU64(bad, 65, m);
    EXPECT_FALSE(OpenOnly(bad).ok()) << m;
  }
}

TEST_F(TensorizerCorruptionTest, EveryIndexEntryByteIsCrossChecked) {
  const std::string good = ReadBytes(kDir / kEdge);
  const std::vector<Layout> layouts = Layouts(kEdge);
  ASSERT_EQ(layouts.size(), 21u);
  for (size_t k : {0u, 15u, 17u}) {  // f32, meta_f16_4x8, a JSON-path name
    for (size_t i = layouts[k].entry; i < layouts[k].entry_end; ++i) {
      for (char mask : {'\x01', '\x80'}) {
        std::string bad = good;
        bad[i] ^= mask;
        const absl::Status status = OpenOnly(bad);
        ASSERT_FALSE(status.ok()) << "byte " << i << " of entry " << k;
        EXPECT_CONTAINS(status.message(), Path().string());
      }
    }
  }
}

TEST_F(TensorizerCorruptionTest, EveryRecordHeaderByteIsCheckedOrHashed) {
  struct Case {
    const char* file;
    size_t tensor;
  };
  for (const Case& c :
       {Case{kEdge, 0}, Case{kEdge, 15}, Case{kEdge, 20}, Case{kRaw, 1}, Case{kRaw, 3}}) {
    const std::string good = ReadBytes(kDir / c.file);
    const Layout l = Layouts(c.file)[c.tensor];
    for (size_t i = l.record; i < l.data; ++i) {
      std::string bad = good;
      bad[i] ^= 0x01;
      const absl::Status status =
          OpenAndRead(bad, c.file == std::string(kRaw) ? RawKey() : std::nullopt);
      ASSERT_FALSE(status.ok()) << c.file << " tensor " << c.tensor << " byte " << i - l.record;
      EXPECT_CONTAINS(status.message(), Path().string());
    }
  }
}

TEST_F(TensorizerCorruptionTest, FlippedDataFailsTheHashNamingTheTensor) {
  const char* fixture = "llama_tiny_hf_fp32.tensors";
  const std::string good = ReadBytes(kDir / fixture);
  absl::StatusOr<TensorizerFile> original = TensorizerFile::Open(kDir / fixture);
  ASSERT_TRUE(original.ok());
  for (const char* name :
       {"model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "lm_head.weight"}) {
    const TensorInfo* t = original->Find(name);
    ASSERT_NE(t, nullptr);
    for (uint64_t at : {t->data_offset, t->data_offset + t->data_length / 2,
                        t->data_offset + t->data_length - 1}) {
      std::string bad = good;
      bad[at] ^= 0x01;
      ExpectError(OpenAndRead(bad), absl::StatusCode::kDataLoss,
                  {std::string("tensor \"") + name + "\"", "CRC32 mismatch"});
      // Unverified, the flip goes unnoticed; the bytes come back as stored.
      EXPECT_TRUE(OpenAndRead(bad, std::nullopt, HashCheck::kNone).ok());
    }
  }
}

TEST_F(TensorizerCorruptionTest, FlippedCiphertextFailsTheMacNamingTheTensor) {
  const std::string good = ReadBytes(kDir / kRaw);
  const std::vector<Layout> layouts = Layouts(kRaw);
  // big_f32_3000: 4096-byte pieces, so byte 9000 is in piece 2 of 3.
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32, HashCheck::kNone}) {
    std::string bad = good;
    bad[layouts[1].data + 9000] ^= 0x01;
    ExpectError(OpenAndRead(bad, RawKey(), check), absl::StatusCode::kDataLoss,
                {"tensor \"big_f32_3000\"", "piece 2 of 3", "MAC", "corrupted"});
  }
  std::string bad = good;
  bad[layouts[0].data + 39] ^= 0x80;
  ExpectError(OpenAndRead(bad, RawKey()), absl::StatusCode::kDataLoss,
              {"tensor \"small_f32\"", "MAC"});
  // bf16_4x4 has the smallest piece, which is tried first to check the key: a flip there cannot
  // be told from a wrong key, but the message still names the tensor.
  bad = good;
  bad[layouts[2].data] ^= 0x01;
  const absl::Status status = OpenAndRead(bad, RawKey());
  ASSERT_FALSE(status.ok());
  EXPECT_CONTAINS(status.message(), "tensor \"bf16_4x4\"");
}

TEST_F(TensorizerCorruptionTest, TruncationAtEveryRecordBoundaryAndMidRecord) {
  for (const char* fixture : {kEdge, kRaw}) {
    const std::string good = ReadBytes(kDir / fixture);
    std::vector<size_t> cuts = {0, 4, 40, 72, 73, 100, 73 + 262144 - 1};
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(kDir / fixture);
    ASSERT_TRUE(file.ok());
    for (const TensorInfo& t : file->tensors()) {
      const uint64_t h = t.data_offset - t.header_offset;
      for (uint64_t cut : {t.header_offset, t.header_offset + 4, t.header_offset + h / 2,
                           t.data_offset - 1, t.data_offset, t.data_offset + t.data_length / 2}) {
        cuts.push_back(cut);
      }
    }
    cuts.push_back(good.size() - 8);  // every record complete, marker missing
    cuts.push_back(good.size() - 1);
    for (size_t cut : cuts) {
      SCOPED_TRACE(::testing::Message() << fixture << " cut at " << cut);
      ExpectError(OpenOnly(good.substr(0, cut)), absl::StatusCode::kDataLoss);
    }
  }
}

TEST_F(TensorizerCorruptionTest, IndexOffsetsOutsideTheFile) {
  const std::string good = ReadBytes(kDir / kEdge);
  const Layout l = Layouts(kEdge)[2];  // f16
  for (uint64_t offset : {uint64_t{good.size()}, uint64_t{good.size() - 4}, kMax - 3, kMax}) {
    std::string bad = good;
    PutU64(bad, l.entry_header_offset, offset);
    ExpectError(OpenOnly(bad), absl::StatusCode::kDataLoss, {"tensor \"f16\"", "past the end"});
  }
  for (uint64_t offset : {uint64_t{0}, uint64_t{73}, uint64_t{262216}}) {
    std::string bad = good;
    PutU64(bad, l.entry_header_offset, offset);
    ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument,
                {"tensor \"f16\"", "file header or index"});
  }
  std::string bad = good;
  PutU64(bad, l.entry_header_offset + 8, kMax);  // data_offset
  ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"tensor \"f16\"", "data_offset"});
}

TEST_F(TensorizerCorruptionTest, NegativeDataLength) {
  const std::string good = ReadBytes(kDir / kEdge);
  const Layout l = Layouts(kEdge)[0];
  std::string bad = good;
  PutU64(bad, l.entry_header_offset + 16, uint64_t{1} << 63);
  ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"tensor \"f32\"", "negative"});
  bad = good;
  PutU64(bad, l.data - 8, kMax);  // the record's i64 data_length = -1
  ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"tensor \"f32\"", "negative"});
}

TEST_F(TensorizerCorruptionTest, AbsurdNameLengthRankAndDims) {
  const std::string good = ReadBytes(kDir / kEdge);
  const std::vector<Layout> layouts = Layouts(kEdge);
  std::string bad = good;
  PutU16(bad, layouts[0].entry, 0xFFFF);
  EXPECT_FALSE(OpenOnly(bad).ok());
  bad = good;
  PutU16(bad, layouts[0].record + 11, 0xFFFF);  // the record's name_len
  ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"tensor \"f32\""});
  bad = good;
  bad[layouts[0].entry_dims - 1] = '\xff';  // ndim 255
  EXPECT_FALSE(OpenOnly(bad).ok());

  // Dims patched consistently in the index and the record, so only the sizes can object.
  auto with_dims = [&](size_t k, uint32_t d0, uint32_t d1) {
    std::string out = good;
    for (size_t at : {layouts[k].entry_dims, layouts[k].record_dims}) {
      PutU32(out, at, d0);
      PutU32(out, at + 4, d1);
    }
    return out;
  };
  const size_t meta = 15;  // meta_f16_4x8
  ExpectError(OpenOnly(with_dims(meta, 0xFFFFFFFF, 0xFFFFFFFF)), absl::StatusCode::kInvalidArgument,
              {"tensor \"meta_f16_4x8\"", "overflows"});
  ExpectError(OpenOnly(with_dims(meta, 1u << 20, 1u << 20)), absl::StatusCode::kInvalidArgument,
              {"tensor \"meta_f16_4x8\"", "limit"});
  ExpectError(OpenOnly(with_dims(0, 0xFFFFFFFF, 4)), absl::StatusCode::kInvalidArgument,
              {"tensor \"f32\"", "data_length"});
  // 8 GiB of zeros: served from one read-only anonymous mapping, never allocated. The header no
  // longer matches its hashes, so only the unverified read succeeds.
  const std::string big = with_dims(meta, 1u << 16, 1u << 16);
  ExpectError(OpenAndRead(big), absl::StatusCode::kDataLoss, {"tensor \"meta_f16_4x8\""});
  WriteBytes(Path(), big);
  absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(Path());
  ASSERT_TRUE(file.ok()) << file.status();
  ReadOptions options;
  options.hash_check = HashCheck::kNone;
  absl::StatusOr<std::vector<TensorBytes>> bytes = file->ReadAll(options);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const TensorBytes& zeros = (*bytes)[meta];
  ASSERT_EQ(zeros.size, size_t{1} << 33);
  EXPECT_EQ(zeros.data[0], std::byte{0});
  EXPECT_EQ(zeros.data[zeros.size - 1], std::byte{0});
}

TEST_F(TensorizerCorruptionTest, DuplicateNamesAreRefused) {
  std::string bad = ReadBytes(kDir / kEdge);
  const std::vector<Layout> layouts = Layouts(kEdge);
  bad.replace(layouts[1].entry + 2, 3, "f32");  // f64 -> f32, in the index and the record
  bad.replace(layouts[1].record_name, 3, "f32");
  ExpectError(OpenOnly(bad), absl::StatusCode::kInvalidArgument, {"duplicate", "\"f32\""});
}

// --- Hand-built files: crypt-info layouts no fixture has. -------------------------------------

// One record of `data` as dtype |u1, shape [size]; `crypt` is the crypt-info body (without its
// u64 length), used when the file has crypt info; `stored` replaces the data in the file.
struct Rec {
  std::string name;
  std::string data;
  std::string crypt = std::string(2, '\0');  // chunk_count 0
  std::optional<std::string> stored;
};

std::string Build(uint32_t version, bool flag, const std::vector<Rec>& recs) {
  FileHeader fh;
  fh.version = version;
  fh.encrypted_flag = flag;
  fh.tensor_count = recs.size();
  fh.index_size = kStandardIndexSize;
  std::string index, records;
  uint64_t offset = kFileHeaderSize + kStandardIndexSize;
  for (const Rec& r : recs) {
    std::string h(8, '\0');
    AppendLe<uint16_t>(h, 0);
    AppendLe<uint8_t>(h, 2);
    AppendLe<uint16_t>(h, static_cast<uint16_t>(r.name.size()));
    h += r.name + "\x03|u1\x01";
    AppendLe<uint32_t>(h, static_cast<uint32_t>(r.data.size()));
    h += std::string("\x29\x00\x02\x00\x04", 5);
    const HashField hashes[] = {{HashType::kCrc32, static_cast<uint32_t>(h.size()), 4},
                                {HashType::kSha256, static_cast<uint32_t>(h.size() + 6), 32}};
    h += std::string(4, '\0') + "\x01\x20" + std::string(32, '\0');
    const uint64_t crypt_begin = h.size();
    if (fh.has_crypt_info()) h += U64Le(r.crypt.size()) + r.crypt;
    const uint64_t crypt_end = h.size();
    AppendLe<int64_t>(h, static_cast<int64_t>(r.data.size()));
    PutU64(h, 0, h.size());
    const absl::StatusOr<Digests> d = ComputeDigests(
        {reinterpret_cast<const std::byte*>(h.data()), h.size()}, hashes, crypt_begin, crypt_end,
        {reinterpret_cast<const std::byte*>(r.data.data()), r.data.size()}, true, true);
    EXPECT_TRUE(d.ok());
    PutU32(h, hashes[0].value_offset, d->crc32);
    h.replace(hashes[1].value_offset, 32, reinterpret_cast<const char*>(d->sha256.data()), 32);
    SerializeIndexEntry({r.name,
                         TensorType::kStateDict,
                         "|u1",
                         {static_cast<int64_t>(r.data.size())},
                         offset,
                         offset + h.size(),
                         r.data.size()},
                        index);
    records += h + r.stored.value_or(r.data);
    offset += h.size() + r.data.size();
    fh.tensor_bytes += r.data.size();
  }
  index.resize(kStandardIndexSize, '\0');
  return SerializeFileHeader(fh) + index + records + U64Le(0);
}

std::string Chunk(uint16_t type, const std::string& body) {
  std::string out = U64Le(2 + body.size());
  AppendLe<uint16_t>(out, type);
  return out + body;
}

std::string CryptInfo(const std::vector<std::string>& chunks) {
  std::string out;
  AppendLe<uint16_t>(out, static_cast<uint16_t>(chunks.size()));
  for (const std::string& c : chunks) out += c;
  return out;
}

std::string NonceBytes(const Nonce& n) { return std::string(n.begin(), n.end()); }

const std::string kKey = [] {
  std::string key;
  for (int i = 0; i < 32; ++i) key.push_back(static_cast<char>(0xA0 + i));
  return key;
}();
SecretKey TestKey() {
  return SecretKey(std::span<const uint8_t, 32>(reinterpret_cast<const uint8_t*>(kKey.data()), 32));
}

// A type-2 record: `data` sealed in `chunk_size` pieces with nonces counting up from `nonce`.
// Returns the cipher chunk; the ciphertext goes to `stored`.
std::string ParallelCipher(const std::string& data, uint64_t chunk_size, const Nonce& nonce,
                           std::string& stored, uint64_t mac_count_override = 0) {
  stored.assign(data.size(), '\0');
  std::string macs;
  uint64_t count = 0;
  for (uint64_t off = 0; off < data.size(); off += chunk_size, ++count) {
    uint8_t mac[kMacBytes];
    const uint64_t n = std::min<uint64_t>(chunk_size, data.size() - off);
    SealDetached(reinterpret_cast<std::byte*>(stored.data() + off),
                 reinterpret_cast<const std::byte*>(data.data() + off), n, mac,
                 ChunkNonce(nonce, count), TestKey());
    macs.append(reinterpret_cast<const char*>(mac), kMacBytes);
  }
  if (mac_count_override != 0) {
    count = mac_count_override;
    macs.resize(count * kMacBytes, '\0');
  }
  return Chunk(2, U64Le(chunk_size) + NonceBytes(nonce) + U64Le(count) + macs);
}

std::string Pattern(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i * 7 + i / 256);
  return out;
}

Nonce CarryingNonce() {
  Nonce n;
  n.fill(0xFF);
  n[23] = 0x12;  // the first increment carries through 23 bytes
  return n;
}

class TensorizerCraftedTest : public TensorizerCorruptionTest {
 protected:
  absl::StatusOr<std::vector<std::string>> ReadAllText(const std::string& bytes,
                                                       std::optional<DecryptionKey> key) {
    WriteBytes(Path(), bytes);
    absl::StatusOr<TensorizerFile> file = TensorizerFile::Open(Path());
    if (!file.ok()) return file.status();
    ReadOptions options;
    options.key = std::move(key);
    absl::StatusOr<std::vector<TensorBytes>> read = file->ReadAll(options);
    if (!read.ok()) return read.status();
    std::vector<std::string> out;
    for (const TensorBytes& b : *read)
      out.emplace_back(reinterpret_cast<const char*>(b.data), b.size);
    return out;
  }
};

TEST_F(TensorizerCraftedTest, ParallelPiecesWithCarryingNoncesAndUnknownChunks) {
  const std::string data = Pattern(3000);
  Rec rec{"t", data};
  std::string stored;
  rec.crypt = CryptInfo(
      {Chunk(77, "future"), ParallelCipher(data, 1024, CarryingNonce(), stored), Chunk(9, "")});
  rec.stored = stored;
  Rec plain{"plain", Pattern(10)};  // empty crypt info: not encrypted
  for (uint32_t version : {3u, 4u}) {
    absl::StatusOr<std::vector<std::string>> got =
        ReadAllText(Build(version, version == 4, {rec, plain}), DecryptionKey::FromRawKey(kKey));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0], data);
    EXPECT_EQ((*got)[1], plain.data);
  }
}

TEST_F(TensorizerCraftedTest, SequentialCipherChunk) {
  const std::string data = Pattern(5000);
  std::string stored(data.size(), '\0');
  uint8_t tag[kMacBytes];
  Nonce nonce = CarryingNonce();
  SealDetached(reinterpret_cast<std::byte*>(stored.data()),
               reinterpret_cast<const std::byte*>(data.data()), data.size(), tag, nonce, TestKey());
  Rec rec{"seq", data};
  rec.crypt =
      CryptInfo({Chunk(3, NonceBytes(nonce) + std::string(reinterpret_cast<char*>(tag), 16))});
  rec.stored = stored;
  absl::StatusOr<std::vector<std::string>> got =
      ReadAllText(Build(3, false, {rec}), DecryptionKey::FromRawKey(kKey));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], data);
}

TEST_F(TensorizerCraftedTest, BadCipherChunksAreRefused) {
  const std::string data = Pattern(3000);
  std::string stored;
  auto build = [&](const std::string& crypt) {
    Rec rec{"t", data, crypt, stored};
    return Build(3, false, {rec});
  };
  for (uint64_t chunk_size : {uint64_t{0}, uint64_t{1000}, uint64_t{1088 + 32}}) {
    const std::string cipher = ParallelCipher(data, 1024, Nonce{}, stored);
    std::string bad = cipher;
    PutU64(bad, 10, chunk_size);
    ExpectError(OpenOnly(build(CryptInfo({bad}))), absl::StatusCode::kInvalidArgument,
                {"tensor \"t\"", "chunk_size"});
  }
  ExpectError(OpenOnly(build(CryptInfo({ParallelCipher(data, 1024, Nonce{}, stored, 2)}))),
              absl::StatusCode::kInvalidArgument, {"tensor \"t\"", "2 MACs", "need 3"});
  // A chunk length past the crypt-info block, and bytes left after the last chunk.
  std::string cipher = ParallelCipher(data, 1024, Nonce{}, stored);
  std::string bad = cipher;
  PutU64(bad, 0, 1u << 20);
  ExpectError(OpenOnly(build(CryptInfo({bad}))), absl::StatusCode::kInvalidArgument,
              {"tensor \"t\"", "crypt info"});
  ExpectError(OpenOnly(build(CryptInfo({cipher}) + "xx")), absl::StatusCode::kInvalidArgument,
              {"tensor \"t\"", "crypt info"});
  // MAC count whose byte size overflows.
  bad = cipher;
  PutU64(bad, 10 + 8 + 24, uint64_t{1} << 60);
  ExpectError(OpenOnly(build(CryptInfo({bad}))), absl::StatusCode::kInvalidArgument,
              {"tensor \"t\"", "MACs"});
}

TEST_F(TensorizerCraftedTest, KeyDerivationParametersAreBounded) {
  const std::string data = Pattern(100);
  std::string stored;
  const std::string cipher = ParallelCipher(data, 1024, Nonce{}, stored);
  auto kdf = [](uint64_t ops, uint64_t mem) {
    std::string body;
    AppendLe<uint16_t>(body, 1);
    body += U64Le(ops) + U64Le(mem);
    AppendLe<int32_t>(body, 2);
    AppendLe<uint16_t>(body, 16);
    return Chunk(1, body + "fixture-salt-16b");
  };
  Rec rec{"t", data, CryptInfo({kdf(1, uint64_t{1} << 50), cipher}), stored};
  const std::string file = Build(3, false, {rec});
  absl::StatusOr<std::vector<std::string>> got =
      ReadAllText(file, DecryptionKey::FromPassphrase("any"));
  ExpectError(got.status(), absl::StatusCode::kInvalidArgument, {"tensor \"t\"", "memlimit"});
  // A raw key needs no derivation, so the parameters do not matter.
  got = ReadAllText(file, DecryptionKey::FromRawKey(kKey));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)[0], data);
}

}  // namespace
}  // namespace kiln::tensorizer
