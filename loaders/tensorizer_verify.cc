#include "loaders/tensorizer_verify.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"

namespace kiln::tensorizer {
namespace {

// Plaintext is hashed in blocks of this size: small enough to stay in the core's L2 cache
// between the copy and both hashes (1 MiB blocks cost 5% more here), large enough that a read
// call per block costs little.
constexpr size_t kBlockBytes = size_t{256} << 10;
// A CRC32 that is computed apart from its record's SHA-256 is split into pieces of at most this
// size, so the pieces of a large tensor spread over every thread and the last one ends soon.
constexpr uint64_t kCrcPieceBytes = uint64_t{8} << 20;

std::span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// At most one block buffer per thread: a task takes one and gives it back when done.
class BlockBuffers {
 public:
  std::unique_ptr<std::byte[]> Take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        std::unique_ptr<std::byte[]> buffer = std::move(free_.back());
        free_.pop_back();
        return buffer;
      }
    }
    return std::make_unique_for_overwrite<std::byte[]>(kBlockBytes);
  }
  void Return(std::unique_ptr<std::byte[]> buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(buffer));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<std::byte[]>> free_;
};

// Reads exactly out.size() bytes at `offset` (pread may return fewer).
absl::Status ReadExactly(int fd, uint64_t offset, std::span<std::byte> out,
                         const RecordToVerify& record, const FileErrors& err) {
  while (!out.empty()) {
    const ssize_t got = ::pread(fd, out.data(), out.size(), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      return err.DataLoss(
          "tensor ", QuoteName(record.name), ": reading its data at offset ", offset,
          " to check its hashes failed: ",
          got == 0 ? "the file ends there (truncated while loading?)" : std::strerror(errno));
    }
    out = out.subspan(static_cast<size_t>(got));
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

// Hands plaintext bytes [begin, end) of `record` to `consume`, one block at a time: read through
// the descriptor into `buffer` when the record is in the file and one is given, else in place.
template <typename Consume>
absl::Status ForEachBlock(const RecordToVerify& record, uint64_t begin, uint64_t end, int fd,
                          std::byte* buffer, const FileErrors& err, Consume&& consume) {
  const bool read = fd >= 0 && record.in_file;
  for (uint64_t at = begin; at < end; at += kBlockBytes) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlockBytes, end - at));
    std::span<const std::byte> block(record.data + at, n);
    if (read) {
      KILN_RETURN_IF_ERROR(
          ReadExactly(fd, record.file_offset + at, std::span<std::byte>(buffer, n), record, err));
      block = std::span<const std::byte>(buffer, n);
    }
    KILN_RETURN_IF_ERROR(consume(block));
  }
  return absl::OkStatus();
}

class Sha256 {
 public:
  absl::Status Init() {
    if (ctx_ == nullptr || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1) {
      return absl::InternalError("cannot initialize OpenSSL SHA-256");
    }
    return absl::OkStatus();
  }
  absl::Status Update(std::span<const std::byte> bytes) {
    if (EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size()) != 1) {
      return absl::InternalError("OpenSSL SHA-256 update failed");
    }
    return absl::OkStatus();
  }
  absl::Status Final(std::array<uint8_t, 32>& digest) {
    unsigned int length = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), digest.data(), &length) != 1 || length != 32) {
      return absl::InternalError("OpenSSL SHA-256 final failed");
    }
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_{EVP_MD_CTX_new(), &EVP_MD_CTX_free};
};

// What is checked of one record, and what its tasks computed.
struct RecordPlan {
  std::string hashed_header;  // the header bytes as hashed (§6.1)
  bool check_crc32 = false;
  bool check_sha256 = false;
  // The CRC32 is computed in pieces apart from the SHA-256 pass (there may be none).
  bool crc32_in_pieces = false;
  uint32_t crc32 = 0;  // of the whole stream when computed with the SHA-256
  std::array<uint8_t, 32> sha256{};
  std::vector<uint32_t> piece_crc32;  // CRC32 of each piece of the plaintext, from 0
};

// One unit of work: a record's SHA-256 pass (with its CRC32 unless that is in pieces), or the
// CRC32 of one piece of its plaintext.
struct Task {
  size_t record = 0;
  bool sha256 = false;
  size_t piece = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
};

absl::Status RunShaPass(const RecordToVerify& record, RecordPlan& plan, int fd, std::byte* buffer,
                        const FileErrors& err) {
  const bool with_crc32 = plan.check_crc32 && !plan.crc32_in_pieces;
  Sha256 sha;
  KILN_RETURN_IF_ERROR(sha.Init());
  const std::span<const std::byte> header = AsBytes(plan.hashed_header);
  KILN_RETURN_IF_ERROR(sha.Update(header));
  uint32_t crc = with_crc32 ? Crc32(0, header) : 0;
  KILN_RETURN_IF_ERROR(
      ForEachBlock(record, 0, record.size, fd, buffer, err, [&](std::span<const std::byte> block) {
        if (with_crc32) crc = Crc32(crc, block);
        return sha.Update(block);
      }));
  KILN_RETURN_IF_ERROR(sha.Final(plan.sha256));
  plan.crc32 = crc;
  return absl::OkStatus();
}

absl::Status RunCrcPiece(const RecordToVerify& record, RecordPlan& plan, const Task& task, int fd,
                         std::byte* buffer, const FileErrors& err) {
  uint32_t crc = 0;
  KILN_RETURN_IF_ERROR(ForEachBlock(record, task.begin, task.end, fd, buffer, err,
                                    [&](std::span<const std::byte> block) {
                                      crc = Crc32(crc, block);
                                      return absl::OkStatus();
                                    }));
  plan.piece_crc32[task.piece] = crc;
  return absl::OkStatus();
}

std::string Hex(const uint8_t* bytes, size_t n) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), n));
}

}  // namespace

absl::string_view HashCheckName(HashCheck check) {
  switch (check) {
    case HashCheck::kNone:
      return "none";
    case HashCheck::kCrc32:
      return "crc32";
    case HashCheck::kAll:
      return "all";
  }
  return "?";
}

absl::StatusOr<HashCheck> ParseHashCheck(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  for (HashCheck check : {HashCheck::kAll, HashCheck::kCrc32, HashCheck::kNone}) {
    if (lower == HashCheckName(check)) return check;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown hash check \"", absl::CHexEscape(name),
                   "\": use \"all\" (CRC32 and SHA-256), \"crc32\" (CRC32 only) or \"none\""));
}

absl::Status VerifyRecordHashes(std::span<const RecordToVerify> records,
                                const VerifyOptions& options, const FileErrors& err) {
  if (options.check == HashCheck::kNone) return absl::OkStatus();
  const size_t n = records.size();
  std::vector<RecordPlan> plans(n);
  uint64_t sha_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    const RecordToVerify& r = records[i];
    RecordPlan& plan = plans[i];
    bool has_crc32 = false, has_sha256 = false;
    for (const HashField& field : r.hashes) {
      (field.type == HashType::kCrc32 ? has_crc32 : has_sha256) = true;
    }
    plan.check_crc32 = has_crc32;
    plan.check_sha256 =
        has_sha256 && (options.check == HashCheck::kAll || (!has_crc32 && !r.authenticated));
    if (!plan.check_crc32 && !plan.check_sha256) continue;
    plan.hashed_header = HashedHeaderBytes(r.header, r.hashes, r.crypt_begin, r.crypt_end);
    if (plan.check_sha256) sha_bytes += r.size;
  }

  const size_t workers = std::max<size_t>(
      1, options.threads > 0 ? static_cast<size_t>(options.threads)
                             : std::max<unsigned>(1, std::thread::hardware_concurrency()));
  std::vector<Task> sha_tasks, crc_tasks;
  for (size_t i = 0; i < n; ++i) {
    const RecordToVerify& r = records[i];
    RecordPlan& plan = plans[i];
    if (plan.check_sha256) sha_tasks.push_back({i, true, 0, 0, r.size});
    // A SHA-256 pass longer than a fair share of all of them sets the load's end: its CRC32 is
    // better read a second time by the other threads than computed in that pass.
    const bool sha_pass_is_critical =
        plan.check_sha256 && workers > 1 && r.size * workers > sha_bytes;
    plan.crc32_in_pieces = plan.check_crc32 && (!plan.check_sha256 || sha_pass_is_critical);
    if (!plan.crc32_in_pieces) continue;
    const uint64_t pieces = std::max<uint64_t>(1, (r.size + kCrcPieceBytes - 1) / kCrcPieceBytes);
    plan.piece_crc32.resize(pieces);
    for (uint64_t k = 0; k < pieces; ++k) {
      crc_tasks.push_back(
          {i, false, k, k * kCrcPieceBytes, std::min(r.size, (k + 1) * kCrcPieceBytes)});
    }
  }
  // Longest first (LPT): SHA-256 passes by size, then the CRC32 pieces, a tenth the cost per
  // byte, which fill in around the passes so that no thread idles while another finishes one.
  auto larger = [](const Task& a, const Task& b) { return a.end - a.begin > b.end - b.begin; };
  std::stable_sort(sha_tasks.begin(), sha_tasks.end(), larger);
  std::stable_sort(crc_tasks.begin(), crc_tasks.end(), larger);
  std::vector<Task> tasks = std::move(sha_tasks);
  tasks.insert(tasks.end(), crc_tasks.begin(), crc_tasks.end());

  BlockBuffers buffers;
  KILN_RETURN_IF_ERROR(
      ParallelFor(tasks.size(), static_cast<int>(workers), [&](size_t k) -> absl::Status {
        const Task& task = tasks[k];
        std::unique_ptr<std::byte[]> buffer = buffers.Take();
        const absl::Status status = task.sha256
                                        ? RunShaPass(records[task.record], plans[task.record],
                                                     options.descriptor, buffer.get(), err)
                                        : RunCrcPiece(records[task.record], plans[task.record],
                                                      task, options.descriptor, buffer.get(), err);
        buffers.Return(std::move(buffer));
        return status;
      }));

  for (size_t i = 0; i < n; ++i) {
    const RecordToVerify& r = records[i];
    RecordPlan& plan = plans[i];
    if (plan.crc32_in_pieces) {
      plan.crc32 = Crc32(0, AsBytes(plan.hashed_header));
      for (size_t k = 0; k < plan.piece_crc32.size(); ++k) {
        const uint64_t length = std::min(r.size, (k + 1) * kCrcPieceBytes) - k * kCrcPieceBytes;
        plan.crc32 = Crc32Combine(plan.crc32, plan.piece_crc32[k], length);
      }
    }
    for (const HashField& field : r.hashes) {
      const std::byte* stored = r.header.data() + field.value_offset;
      if (field.type == HashType::kCrc32 && plan.check_crc32) {
        const uint32_t value = LoadLe<uint32_t>(stored);
        if (value != plan.crc32) {
          return err.DataLoss("tensor ", QuoteName(r.name), ": CRC32 mismatch (stored 0x",
                              absl::Hex(value, absl::kZeroPad8), ", computed 0x",
                              absl::Hex(plan.crc32, absl::kZeroPad8), ")");
        }
      } else if (field.type == HashType::kSha256 && plan.check_sha256 &&
                 std::memcmp(stored, plan.sha256.data(), plan.sha256.size()) != 0) {
        return err.DataLoss("tensor ", QuoteName(r.name), ": SHA-256 mismatch (stored ",
                            Hex(reinterpret_cast<const uint8_t*>(stored), 32), ", computed ",
                            Hex(plan.sha256.data(), 32), ")");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::tensorizer
