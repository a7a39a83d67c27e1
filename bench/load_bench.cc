// Load speed of one Qwen2.5-0.5B-shaped bf16 model (≈1 GB) through every loader, in one run:
// safetensors, raw Tensorizer (hashes verified and not), native tensorized (verified and not).
// For each it prints medians of
//   open   the loader stage alone (map, validate, verify hashes, decrypt): a WeightSource
//   load   open → PreparedModel (Bind, Restore, PostLoad packing included)
// as seconds, GB/s of file bytes, and the ratio to reading the same file bytes once with read(2).
// Two tables: page cache warm (the files stay cached; the reads and loads are CPU and memory
// bound) and cold (the files are evicted from the page cache before every read and every load,
// as on a first start: they come from storage). Goals: safetensors and native loads ≤ 1.5×
// reading the bytes; hash-verified Tensorizer ≤ 2×.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "bench/bench_util.h"
#include "clients/synth.h"
#include "kernels/backend_registry.h"
#include "loaders/load_model.h"
#include "loaders/tensorizer_reader.h"
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
  bool verify_hashes;
  double goal;
};

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
  const std::vector<Variant> variants = {
      {"safetensors", dir, safetensors_files, true, 1.5},
      {"raw tensorizer, hashes verified", raw, {raw}, true, 2.0},
      {"raw tensorizer, no verification", raw, {raw}, false, 0},
      {"native tensorized, hashes verified", native, {native}, true, 0},
      {"native tensorized, no verification", native, {native}, false, 1.5},
  };
  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend("cpu");
  if (!created.ok()) return 1;
  std::shared_ptr<Backend> backend(std::move(*created));

  const std::string tables = absl::GetFlag(FLAGS_cache);
  for (const bool cold : {false, true}) {
    if (tables.find(cold ? "cold" : "warm") == std::string::npos) continue;
    std::printf("\n%-36s %8s %8s %7s | %8s %8s %7s | %s\n",
                cold ? "page cache COLD (from storage)" : "page cache WARM", "read s", "open s",
                "×read", "load s", "GB/s", "×read", "goal (load ×read)");
    for (const Variant& variant : variants) {
      if (std::string(variant.name).find(absl::GetFlag(FLAGS_only)) == std::string::npos) {
        continue;
      }
      LoadOptions options;
      options.tensorizer.verify_hashes = variant.verify_hashes;
      uint64_t bytes = 0;
      if (!cold) ReadOnce(variant.files, &bytes);  // warm the page cache
      // Before each measurement: a cold one starts from storage, a warm one from the cache.
      auto prepare = [&] {
        if (cold && !Evict(variant.files)) {
          std::fprintf(stderr, "cannot evict %s from the page cache\n", variant.path.c_str());
          std::exit(1);
        }
      };
      std::vector<double> reads, opens, loads;
      for (int r = 0; r < repeats; ++r) {
        prepare();
        reads.push_back(ReadOnce(variant.files, &bytes));
        {
          prepare();
          const auto start = Clock::now();
          absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(variant.path, options);
          opens.push_back(Seconds(start));
          if (!opened.ok()) {
            return std::fprintf(stderr, "%s\n", opened.status().ToString().c_str()), 1;
          }
        }
        prepare();
        const auto start = Clock::now();
        absl::StatusOr<std::unique_ptr<PreparedModel>> model =
            LoadModel(variant.path, backend, options);
        loads.push_back(Seconds(start));
        if (!model.ok()) return std::fprintf(stderr, "%s\n", model.status().ToString().c_str()), 1;
      }
      const double read_s = Median(reads), open_s = Median(opens), load_s = Median(loads);
      char goal[64] = "";
      if (variant.goal > 0) {
        std::snprintf(goal, sizeof(goal), "≤ %.1f: %s", variant.goal,
                      load_s / read_s <= variant.goal ? "met" : "NOT met");
      }
      std::printf("%-36s %8.3f %8.3f %7.2f | %8.3f %8.2f %7.2f | %s\n", variant.name, read_s,
                  open_s, open_s / read_s, load_s, bytes / load_s / 1e9, load_s / read_s, goal);
    }
  }
  std::printf(
      "(%.2f GB per load, medians of %d; open = loader stage alone, load = to a "
      "PreparedModel, packing included)\n",
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
