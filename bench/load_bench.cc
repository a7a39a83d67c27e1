// Load speed of one Qwen2.5-0.5B-shaped bf16 model (≈1 GB) through every loader, in one run:
// safetensors, raw Tensorizer (all hashes verified, CRC32s only, none), native tensorized
// (verified and not), and native files holding the linears packed (`kiln tensorize --prepack`,
// bf16, int8 and int4), which a load adopts without packing or quantizing.
// For each it prints medians of
//   open   the loader stage alone (map, validate, verify hashes, decrypt): a WeightSource
//   load   open → PreparedModel (Bind, Restore, PostLoad packing included)
// as seconds, GB/s of file bytes, and the ratio to reading the same file bytes once with read(2).
// Two tables: page cache warm (the files stay cached as a first kiln load left them; the reads
// and loads are CPU and memory bound) and cold (the files are evicted from the page cache before
// every read and every load, as on a first start: they come from storage). Goals: safetensors and
// native loads ≤ 1.5× reading the bytes; prepacked native loads ≤ 1.2×; hash-verified Tensorizer ≤
// 2×, and at most 1.2 × max(hashed bytes ÷ (cores × SHA-256 speed), largest tensor ÷ SHA-256 speed)
// more than the unverified load, with the SHA-256 speed measured here, between the loads.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "bench/bench_util.h"
#include "clients/synth.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "loaders/tensorizer_format.h"
#include "loaders/tensorizer_reader.h"
#include "loaders/tensorizer_verify.h"
#include "loaders/tensorizer_writer.h"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "model shape (kiln synth preset)");
ABSL_FLAG(std::string, model_dir, "build/bench-models", "where synthesized models are kept");
ABSL_FLAG(int32_t, repeats, 5, "repetitions per measurement (the median is printed)");
ABSL_FLAG(std::string, cache, "warm,cold", "which tables to print: warm, cold or both");
ABSL_FLAG(std::string, only, "", "run only the variants whose name contains this (for profiling)");

namespace kiln {
namespace {

namespace fs = std::filesystem;
using bench::Clock;
using bench::Median;
using bench::Seconds;

// Drops the files' pages from the page cache (they are clean: nothing is lost), so the next
// access reads them from storage. False where the kernel refused.
bool Evict(const std::vector<fs::path>& files) {
  bool ok = true;
  for (const fs::path& file : files) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) return false;
    ok = ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0 && ok;
    ::close(fd);
  }
  return ok;
}

// Seconds to read `files` once with read(2); `bytes` receives their total size.
double ReadOnce(const std::vector<fs::path>& files, uint64_t* bytes) {
  std::vector<char> block(8 << 20);
  *bytes = 0;
  const auto start = Clock::now();
  for (const fs::path& file : files) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ssize_t got;
    while ((got = ::read(fd, block.data(), block.size())) > 0) *bytes += static_cast<uint64_t>(got);
    ::close(fd);
  }
  return Seconds(start);
}

// `native`'s weights written prepacked for `backend` (quantized as asked) beside it.
absl::StatusOr<fs::path> PreparePrepacked(const fs::path& native, std::shared_ptr<Backend> backend,
                                          Quantization quantize) {
  const fs::path file =
      native.parent_path() / absl::StrCat("prepacked-", QuantizationName(quantize), ".tensors");
  if (fs::exists(file)) return file;
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(native);
  if (!opened.ok()) return opened.status();
  PostLoadOptions options;
  options.quantize = quantize;
  std::printf("writing %s ...\n", file.c_str());
  absl::Status written = WritePrepackedNativeTensorized(file, opened->source, opened->config,
                                                        std::move(backend), options, {})
                             .status();
  if (!written.ok()) return written;
  return file;
}

absl::Status Prepare(const fs::path& dir, const ModelConfig& config, fs::path* raw,
                     fs::path* native) {
  if (!fs::exists(dir / "config.json")) {
    std::printf("writing %s ...\n", dir.c_str());
    SynthOptions synth;
    synth.dtype = DType::kBF16;
    if (absl::Status status = WriteSynthCheckpoint(dir, config, synth); !status.ok()) return status;
  }
  const fs::path tz_dir = dir.string() + "-tensorizer";
  *raw = tz_dir / "raw.tensors";
  *native = tz_dir / "native.tensors";
  if (fs::exists(*raw) && fs::exists(*native)) return absl::OkStatus();
  fs::create_directories(tz_dir);
  fs::copy_file(dir / "config.json", tz_dir / "config.json", fs::copy_options::overwrite_existing);
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(dir);
  if (!opened.ok()) return opened.status();
  // A raw file as tensorizer's write_state_dict writes it: HF names, CRC32 + SHA-256.
  std::vector<tensorizer::WriteTensor> tensors;
  for (const TensorRecord& record : opened->source.records()) {
    tensorizer::WriteTensor t;
    t.name = record.name;
    t.element_type = record.dtype == DType::kBF16 ? tensorizer::ElementType::kBF16
                                                  : tensorizer::ElementType::kF32;
    t.shape = record.shape;
    t.data = record.data;
    t.size = record.byte_size;
    tensors.push_back(std::move(t));
  }
  std::printf("writing %s and %s ...\n", raw->c_str(), native->c_str());
  if (absl::Status status = tensorizer::WriteTensorizerFile(*raw, tensors); !status.ok()) {
    return status;
  }
  return WriteNativeTensorized(*native, opened->source, opened->config, {}).status();
}

struct Variant {
  const char* name;
  fs::path path;
  std::vector<fs::path> files;
  tensorizer::HashCheck hash_check;
  double goal;  // load ≤ goal × read; 0: none
  // The same file without hash checks (a name in the list): the hashing goal's baseline.
  const char* unverified = nullptr;
  Quantization quantize = Quantization::kNone;  // asked for at load
};

struct Measured {
  std::vector<double> reads, opens, loads;
  std::vector<double> firsts;  // the first forward after the load (one token)
  uint64_t bytes = 0;          // read per load
  int adopted = 0;             // linears adopted from packed images, in the last load
  int adopted_in_place = 0;    // of those, read where they lie in the file's mapping
  int linears = 0;
};

// SHA-256 speed of one core while every core hashes (bytes/s): each thread hashes its own 1 MB
// buffer 128 times through the loader's OpenSSL call (ComputeDigests, EVP SHA-256); the median
// over threads. Measured between the loads and for about as long as a verification runs, so it
// sees the machine they do (on a shared host a short burst runs faster than a sustained pass).
double Sha256BytesPerSecondPerCore(int cores) {
  constexpr size_t kBuffer = size_t{1} << 20;
  constexpr int kPasses = 128;
  std::vector<double> speeds(static_cast<size_t>(cores));
  auto hash = [&](int core) {
    std::vector<std::byte> buffer(kBuffer);
    for (size_t i = 0; i < kBuffer; ++i) buffer[i] = static_cast<std::byte>(i * 131 + core);
    const auto start = Clock::now();
    for (int pass = 0; pass < kPasses; ++pass) {
      absl::StatusOr<tensorizer::Digests> digests =
          tensorizer::ComputeDigests({}, {}, 0, 0, buffer, /*want_crc32=*/false, true);
      if (!digests.ok()) std::exit(1);
      buffer[0] = static_cast<std::byte>(digests->sha256[0]);  // each pass depends on the last
    }
    speeds[static_cast<size_t>(core)] = static_cast<double>(kBuffer) * kPasses / Seconds(start);
  };
  std::vector<std::thread> threads;
  for (int core = 1; core < cores; ++core) threads.emplace_back(hash, core);
  hash(0);
  for (std::thread& t : threads) t.join();
  return Median(speeds);
}

// What the hashes cover: the record data of a Tensorizer file, and its largest record.
struct HashedBytes {
  uint64_t total = 0;
  uint64_t largest = 0;
  std::string largest_name;
};
HashedBytes HashedBytesOf(const fs::path& file) {
  HashedBytes out;
  absl::StatusOr<tensorizer::TensorizerFile> tz = tensorizer::TensorizerFile::Open(file);
  if (!tz.ok()) return out;
  for (const tensorizer::TensorInfo& t : tz->tensors()) {
    out.total += t.data_length;
    if (t.data_length > out.largest) {
      out.largest = t.data_length;
      out.largest_name = t.name;
    }
  }
  return out;
}

int Main() {
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const std::string preset = absl::GetFlag(FLAGS_preset);
  absl::StatusOr<ModelConfig> config = SynthPresetConfig(preset);
  if (!config.ok()) return std::fprintf(stderr, "%s\n", config.status().ToString().c_str()), 1;
  const fs::path dir = fs::path(absl::GetFlag(FLAGS_model_dir)) / (preset + "-bf16");
  fs::path raw, native;
  if (absl::Status status = Prepare(dir, *config, &raw, &native); !status.ok()) {
    return std::fprintf(stderr, "%s\n", status.ToString().c_str()), 1;
  }
  std::vector<fs::path> safetensors_files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".safetensors") safetensors_files.push_back(entry.path());
  }
  using tensorizer::HashCheck;
  constexpr char kRawUnverified[] = "raw tensorizer, no verification";
  constexpr char kNativeUnverified[] = "native tensorized, no verification";
  constexpr char kNativeVerified[] = "native tensorized, hashes verified";
  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend("cpu");
  if (!created.ok()) return 1;
  std::shared_ptr<Backend> backend(std::move(*created));
  fs::path prepacked[3];
  for (const Quantization q : {Quantization::kNone, Quantization::kInt8, Quantization::kInt4}) {
    absl::StatusOr<fs::path> file = PreparePrepacked(native, backend, q);
    if (!file.ok()) return std::fprintf(stderr, "%s\n", file.status().ToString().c_str()), 1;
    prepacked[static_cast<int>(q)] = *file;
  }
  const fs::path& prepacked_bf16 = prepacked[static_cast<int>(Quantization::kNone)];
  const fs::path& prepacked_int8 = prepacked[static_cast<int>(Quantization::kInt8)];
  const fs::path& prepacked_int4 = prepacked[static_cast<int>(Quantization::kInt4)];
  std::vector<Variant> variants = {
      {"safetensors", dir, safetensors_files, HashCheck::kNone, 1.5},
      {"raw tensorizer, hashes verified", raw, {raw}, HashCheck::kAll, 2.0, kRawUnverified},
      {"raw tensorizer, CRC32 only", raw, {raw}, HashCheck::kCrc32, 0, kRawUnverified},
      {kRawUnverified, raw, {raw}, HashCheck::kNone, 0},
      {kNativeVerified, native, {native}, HashCheck::kAll, 0, kNativeUnverified},
      {kNativeUnverified, native, {native}, HashCheck::kNone, 1.5},
      {"native, quantized to int8 at load",
       native,
       {native},
       HashCheck::kNone,
       0,
       nullptr,
       Quantization::kInt8},
      {"native prepacked bf16", prepacked_bf16, {prepacked_bf16}, HashCheck::kNone, 1.2},
      {"native prepacked int8", prepacked_int8, {prepacked_int8}, HashCheck::kNone, 1.2},
      {"native prepacked int4", prepacked_int4, {prepacked_int4}, HashCheck::kNone, 1.2},
  };
  std::erase_if(variants, [](const Variant& v) {
    return std::string(v.name).find(absl::GetFlag(FLAGS_only)) == std::string::npos;
  });
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));

  const std::string tables = absl::GetFlag(FLAGS_cache);
  for (const bool cold : {false, true}) {
    if (tables.find(cold ? "cold" : "warm") == std::string::npos) continue;
    // Every variant once per round, each round starting one later, so the machine's drift and
    // any after-effect of one load on the next fall on every variant alike.
    std::vector<Measured> measured(variants.size());
    std::vector<double> sha_speeds;
    if (!cold) {
      // Warm the page cache as a kiln load leaves it: from storage through kiln's mapping (which
      // asks for 2 MiB pages, so a filesystem with large folios keeps them: prepacked linears
      // are then read where they lie), then read(2) for what the load did not touch.
      for (size_t v = 0; v < variants.size(); ++v) {
        if (!Evict(variants[v].files)) {
          std::fprintf(stderr, "cannot evict %s from the page cache\n", variants[v].path.c_str());
          return 1;
        }
        LoadOptions options;
        options.quantize = variants[v].quantize;
        if (!LoadModel(variants[v].path, backend, options).ok()) return 1;
        ReadOnce(variants[v].files, &measured[v].bytes);
      }
    }
    for (int r = 0; r < repeats; ++r) {
      sha_speeds.push_back(Sha256BytesPerSecondPerCore(cores));
      for (size_t k = 0; k < variants.size(); ++k) {
        const size_t v = (k + static_cast<size_t>(r)) % variants.size();
        const Variant& variant = variants[v];
        Measured& m = measured[v];
        LoadOptions options;
        options.tensorizer.hash_check = variant.hash_check;
        options.quantize = variant.quantize;
        // Before each measurement: a cold one starts from storage, a warm one from the cache.
        auto prepare = [&] {
          if (cold && !Evict(variant.files)) {
            std::fprintf(stderr, "cannot evict %s from the page cache\n", variant.path.c_str());
            std::exit(1);
          }
        };
        prepare();
        m.reads.push_back(ReadOnce(variant.files, &m.bytes));
        {
          prepare();
          const auto start = Clock::now();
          absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(variant.path, options);
          m.opens.push_back(Seconds(start));
          if (!opened.ok()) {
            return std::fprintf(stderr, "%s\n", opened.status().ToString().c_str()), 1;
          }
        }
        prepare();
        const auto start = Clock::now();
        absl::StatusOr<std::unique_ptr<PreparedModel>> model =
            LoadModel(variant.path, backend, options);
        m.loads.push_back(Seconds(start));
        if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;
        m.adopted = (*model)->adopted_linears();
        m.adopted_in_place = (*model)->adopted_in_place_linears();
        m.linears = (*model)->linear_count();
        // The first forward reads every weight: where a load maps bytes without touching them
        // (a prepacked file's linears, every embedding), their page faults and, cold, their reads
        // from storage land here.
        {
          absl::StatusOr<KvCache> cache = (*model)->NewCache(4);
          if (!cache.ok())
            return std::fprintf(stderr, "%s\n", cache.status().ToString().c_str()), 1;
          const int32_t token = 1;
          SequenceChunk chunk{&*cache, {&token, 1}, /*all_logits=*/false};
          std::vector<float> logits;
          const auto first = Clock::now();
          absl::Status status = (*model)->Forward({&chunk, 1}, &logits);
          m.firsts.push_back(Seconds(first));
          if (!status.ok()) return std::fprintf(stderr, "%s\n", status.ToString().c_str()), 1;
        }
      }
    }

    std::printf("\n%-36s %8s %8s %7s | %8s %8s %7s | %8s %7s | %s\n",
                cold ? "page cache COLD (from storage)" : "page cache WARM", "read s", "open s",
                "×read", "load s", "GB/s", "×read", "+first s", "×read", "goal (load ×read)");
    for (size_t v = 0; v < variants.size(); ++v) {
      const Variant& variant = variants[v];
      const Measured& m = measured[v];
      const double read_s = Median(m.reads), open_s = Median(m.opens), load_s = Median(m.loads);
      char goal[64] = "";
      if (variant.goal > 0) {
        std::snprintf(goal, sizeof(goal), "≤ %.1f: %s", variant.goal,
                      load_s / read_s <= variant.goal ? "met" : "NOT met");
      }
      const double first_s = Median(m.firsts);
      std::printf("%-36s %8.3f %8.3f %7.2f | %8.3f %8.2f %7.2f | %8.3f %7.2f | %s\n", variant.name,
                  read_s, open_s, open_s / read_s, load_s, m.bytes / load_s / 1e9, load_s / read_s,
                  first_s, (load_s + first_s) / read_s, goal);
    }

    for (size_t v = 0; v < variants.size(); ++v) {
      const Measured& m = measured[v];
      if (m.adopted == 0) continue;
      std::printf("  %-34s %d of %d linears adopted, %d of them read where they lie (%s)\n",
                  variants[v].name, m.adopted, m.linears, m.adopted_in_place,
                  m.adopted_in_place == m.adopted ? "the file is mapped in 2 MiB pages"
                                                  : "copied: the file is not in 2 MiB pages");
    }

    // The hashing goal: a verified load takes at most 1.2 × the least time SHA-256 needs on
    // these cores longer than the unverified one; CRC32-only rows show what they add.
    const double sha = Median(sha_speeds);
    std::printf(
        "hash checks: SHA-256 %.2f GB/s per core (%d cores hashing at once, median of %d)\n",
        sha / 1e9, cores, repeats);
    for (size_t v = 0; v < variants.size(); ++v) {
      const Variant& variant = variants[v];
      if (variant.unverified == nullptr) continue;
      size_t base = 0;
      while (base < variants.size() && std::string(variants[base].name) != variant.unverified) {
        ++base;
      }
      if (base == variants.size()) continue;  // filtered out by --only
      const HashedBytes hashed = HashedBytesOf(variant.path);
      const double load_s = Median(measured[v].loads), open_s = Median(measured[v].opens);
      const double base_load = Median(measured[base].loads);
      const double base_open = Median(measured[base].opens);
      std::printf("  %-34s load %.3f s = unverified %.3f + %.3f (open +%.3f)", variant.name, load_s,
                  base_load, load_s - base_load, open_s - base_open);
      if (variant.hash_check == HashCheck::kAll && !cold) {  // the goal is for warm loads
        const double spread = static_cast<double>(hashed.total) / (cores * sha);
        const double largest = static_cast<double>(hashed.largest) / sha;
        const double bound = 1.2 * std::max(spread, largest);
        std::printf(
            "; goal +%.3f = 1.2 × max(%.3f GB ÷ (%d × SHA) = %.3f s, %.3f GB (%s) ÷ SHA = "
            "%.3f s): %s",
            bound, hashed.total / 1e9, cores, spread, hashed.largest / 1e9,
            hashed.largest_name.c_str(), largest, load_s <= base_load + bound ? "met" : "NOT met");
      }
      std::printf("\n");
    }
  }
  std::printf(
      "(%.2f GB per load, medians of %d alternated rounds; open = loader stage alone, load = to a "
      "PreparedModel, packing included; +first = the first one-token forward after it, which "
      "faults in what the load only mapped; its ×read is (load + first) ÷ read)\n",
      static_cast<double>(fs::file_size(raw)) / 1e9, repeats);
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_minloglevel = 1;  // the loaders log every load at INFO
  FLAGS_logtostderr = true;
  return kiln::Main();
}
