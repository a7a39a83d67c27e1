// kiln against llama.cpp on the same weights, threads and lengths: prefill of --prompt_tokens
// and batch-1 decode of --decode_tokens, each from an empty cache (what llama-bench's pp and tg
// tests measure), for bf16, kiln int8 vs llama.cpp q8_0 and kiln int4 vs llama.cpp q4_0.
//
// kiln runs in process (LoadModel with LoadOptions::quantize, then PreparedModel::Forward);
// llama.cpp runs as the `llama-bench` binary the user names (-m FILE -t N -p P -n D -r 1 -o json),
// the two back to back in each round, in turns first, so that both see the same machine. Prints
// medians, the kiln ÷ llama.cpp ratios (the median of the rounds' own ratios), and each decode
// against this machine's read bandwidth, probed just before the run:
//   roofline = bytes streamed per token × tokens/s ÷ read bandwidth.
// Without --llama_bench only kiln's numbers and roofline are printed.
//
// The GGUF files hold the weights of the kiln checkpoint: tools/gguf/safetensors_to_gguf.py
// writes the bf16 one, llama.cpp's llama-quantize makes q8_0 and q4_0 from it.
#include <fcntl.h>
#include <omp.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/logging.h"
#include "base/status_macros.h"
#include "bench/bench_model.h"
#include "bench/bench_util.h"
#include "bench/read_bandwidth.h"
#include "kernels/backend_registry.h"
#include "kernels/quantization.h"
#include "loaders/load_model.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, preset, "qwen2.5-0.5b", "model shape (kiln synth preset), bf16 weights");
ABSL_FLAG(std::string, model, "", "a model directory to run instead of the synthesized preset");
ABSL_FLAG(std::string, model_dir, "build/bench-models", "where synthesized models are kept");
ABSL_FLAG(std::string, llama_bench, "", "llama.cpp's llama-bench binary (none: kiln only)");
ABSL_FLAG(std::string, gguf_bf16, "", "GGUF of the same weights in bf16 (for llama-bench)");
ABSL_FLAG(std::string, gguf_q8_0, "", "GGUF of the same weights in q8_0 (llama-quantize)");
ABSL_FLAG(std::string, gguf_q4_0, "", "GGUF of the same weights in q4_0 (llama-quantize)");
ABSL_FLAG(std::string, llama_bench_args, "",
          "more llama-bench arguments, space-separated (e.g. \"-fa 1\")");
ABSL_FLAG(int32_t, threads, 0, "threads for both programs; 0 = one per core");
ABSL_FLAG(int32_t, repeats, 3, "alternating rounds (medians are printed)");
ABSL_FLAG(int32_t, prompt_tokens, 512, "prefill length");
ABSL_FLAG(int32_t, decode_tokens, 128, "tokens decoded at batch 1");
ABSL_FLAG(std::string, backend, "cpu", "kiln compute backend (kernels/backend_registry.h)");

namespace kiln {
namespace {

using bench::Argmax;
using bench::Clock;
using bench::Median;
using bench::Seconds;

// One row of the table: a kiln weight format and llama.cpp's file of the matching format.
struct FormatRow {
  std::string label;
  Quantization kiln_quantization = Quantization::kNone;
  std::string gguf;  // empty: no llama.cpp file given

  // Filled while running.
  std::unique_ptr<PreparedModel> kiln_model;
  std::string kiln_unavailable;  // why kiln has no numbers for this row
  std::string llama_error;       // why llama.cpp has none (after the first failure)
  std::vector<double> kiln_prefill, kiln_decode, llama_prefill, llama_decode;
  // Each decode run's bytes × tokens/s ÷ the bandwidth probed just before it.
  std::vector<double> kiln_roofline, llama_roofline;
};

struct Throughput {
  double prefill = 0;  // tokens/s
  double decode = 0;   // tokens/s
};

// ---------------------------------------------------------------------------------------------
// kiln, in process

// The prompt both programs' prefill stands for: ids spread over the vocabulary.
std::vector<int32_t> SpreadTokens(int32_t count, int64_t vocab_size) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t i = 0; i < count; ++i) {
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>((int64_t{i} * 7919 + 13) % vocab_size);
  }
  return tokens;
}

// One prefill of `prompt` and one decode of `decode_tokens` tokens, each into a fresh cache.
absl::StatusOr<Throughput> MeasureKiln(const PreparedModel& model,
                                       const std::vector<int32_t>& prompt, int32_t decode_tokens) {
  Throughput result;
  std::vector<float> logits;
  {
    KILN_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(static_cast<int64_t>(prompt.size())));
    SequenceChunk chunk{&cache, prompt, false};
    const auto start = Clock::now();
    KILN_RETURN_IF_ERROR(model.Forward({&chunk, 1}, &logits));
    result.prefill = static_cast<double>(prompt.size()) / Seconds(start);
  }
  KILN_ASSIGN_OR_RETURN(KvCache cache, model.NewCache(decode_tokens));
  int32_t next = prompt.front();
  SequenceChunk chunk{&cache, {&next, 1}, false};
  const auto start = Clock::now();
  for (int32_t t = 0; t < decode_tokens; ++t) {
    logits.clear();
    KILN_RETURN_IF_ERROR(model.Forward({&chunk, 1}, &logits));
    next = Argmax(logits);
  }
  result.decode = decode_tokens / Seconds(start);
  return result;
}

// Loads the checkpoint in `row`'s format; a format kiln cannot give leaves the reason instead.
void LoadKilnRow(const std::filesystem::path& checkpoint, std::shared_ptr<Backend> backend,
                 FormatRow& row) {
  LoadOptions options;
  options.quantize = row.kiln_quantization;
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded =
      LoadModel(checkpoint, std::move(backend), options);
  if (!loaded.ok()) {
    row.kiln_unavailable = std::string(loaded.status().message());
    return;
  }
  if ((*loaded)->quantization() != row.kiln_quantization ||
      (row.kiln_quantization != Quantization::kNone && (*loaded)->quantized_linears() == 0)) {
    row.kiln_unavailable =
        absl::StrCat("asked for ", QuantizationName(row.kiln_quantization),
                     ", the model loaded as ", QuantizationName((*loaded)->quantization()), " (",
                     (*loaded)->quantized_linears(), " quantized linears)");
    return;
  }
  row.kiln_model = std::move(*loaded);
}

// ---------------------------------------------------------------------------------------------
// llama.cpp, as a subprocess

struct ProcessOutput {
  int exit_code = 0;  // 128 + signal when killed by one
  std::string out, err;
};

// Runs `argv` (no shell) and collects its stdout and stderr.
absl::StatusOr<ProcessOutput> RunProcess(const std::vector<std::string>& argv) {
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(std::strerror(errno));
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    ::close(out_pipe[0]), ::close(out_pipe[1]);
    return absl::InternalError(std::strerror(errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], STDERR_FILENO);
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int spawn_error =
      posix_spawn(&pid, args[0], &actions, nullptr, args.data(), ::environ);  // errno-style
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]), ::close(err_pipe[1]);
  if (spawn_error != 0) {
    ::close(out_pipe[0]), ::close(err_pipe[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot run ", argv[0], ": ", std::strerror(spawn_error)));
  }
  // Both pipes at once: a child blocked on a full stderr pipe would never finish its stdout.
  ProcessOutput output;
  std::array<pollfd, 2> fds = {pollfd{out_pipe[0], POLLIN, 0}, pollfd{err_pipe[0], POLLIN, 0}};
  std::array<std::string*, 2> sinks = {&output.out, &output.err};
  int open_fds = 2;
  char buffer[1 << 14];
  while (open_fds > 0) {
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      const ssize_t got = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (got > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  output.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return output;
}

// The first 200 characters of a program's output, for error messages.
std::string Excerpt(const std::string& text) {
  return std::string(absl::StripAsciiWhitespace(absl::string_view(text).substr(0, 200)));
}

// The last `lines` lines of `text`, for error messages that quote a program's log.
std::string Tail(const std::string& text, int lines) {
  size_t pos = text.size();
  while (pos > 0 && (text[pos - 1] == '\n' || text[pos - 1] == '\r')) --pos;
  const size_t end = pos;
  for (int seen = 0; pos > 0; --pos) {
    if (text[pos - 1] == '\n' && ++seen == lines) break;
  }
  return text.substr(pos, end - pos);
}

// OK when `path` is a readable file that starts as a GGUF file does.
absl::Status CheckGgufFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  char magic[4] = {};
  file.read(magic, sizeof(magic));
  if (file.gcount() != 4 || std::memcmp(magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a GGUF file (no GGUF magic)"));
  }
  return absl::OkStatus();
}

struct LlamaBenchResult {
  Throughput throughput;
  double tensor_bytes = 0;  // llama-bench's model_size: the bytes of every tensor in the file
};

// llama-bench's JSON (-o json): one object per test; pp has n_gen 0, tg has n_prompt 0.
absl::StatusOr<LlamaBenchResult> ParseLlamaBenchJson(const std::string& text, int32_t prompt_tokens,
                                                     int32_t decode_tokens) {
  const nlohmann::json json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_array()) {
    return absl::DataLossError(
        absl::StrCat("llama-bench output is not a JSON array: \"", Excerpt(text), "\""));
  }
  LlamaBenchResult result;
  bool have_prefill = false, have_decode = false;
  for (const nlohmann::json& test : json) {
    const auto number = [&](const char* key) {
      auto it = test.find(key);
      return it != test.end() && it->is_number() ? it->get<double>() : -1.0;
    };
    const double prompt = number("n_prompt"), gen = number("n_gen"), rate = number("avg_ts");
    if (rate <= 0) continue;
    result.tensor_bytes = std::max(result.tensor_bytes, number("model_size"));
    if (prompt == prompt_tokens && gen == 0) {
      result.throughput.prefill = rate, have_prefill = true;
    } else if (prompt == 0 && gen == decode_tokens) {
      result.throughput.decode = rate, have_decode = true;
    }
  }
  if (!have_prefill || !have_decode) {
    return absl::DataLossError(absl::StrFormat(
        "llama-bench output has no %s test with avg_ts (pp%d, tg%d expected): \"%s\"",
        have_prefill ? "tg" : "pp", prompt_tokens, decode_tokens, Excerpt(text)));
  }
  return result;
}

absl::StatusOr<LlamaBenchResult> MeasureLlamaCpp(const std::string& llama_bench,
                                                 const std::string& gguf, int threads,
                                                 int32_t prompt_tokens, int32_t decode_tokens,
                                                 const std::vector<std::string>& extra_args) {
  std::vector<std::string> argv = {llama_bench,
                                   "-m",
                                   gguf,
                                   "-t",
                                   std::to_string(threads),
                                   "-p",
                                   std::to_string(prompt_tokens),
                                   "-n",
                                   std::to_string(decode_tokens),
                                   "-r",
                                   "1",
                                   "-o",
                                   "json"};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  KILN_ASSIGN_OR_RETURN(ProcessOutput output, RunProcess(argv));
  if (output.exit_code != 0) {
    return absl::InternalError(absl::StrCat("llama-bench -m ", gguf, " exited with ",
                                            output.exit_code, "; its last lines:\n",
                                            Tail(output.err + output.out, 6)));
  }
  absl::StatusOr<LlamaBenchResult> parsed =
      ParseLlamaBenchJson(output.out, prompt_tokens, decode_tokens);
  if (!parsed.ok()) return KilnAnnotate(parsed.status(), gguf);
  return parsed;
}

// ---------------------------------------------------------------------------------------------
// The table

std::string Rate(const std::vector<double>& rates) {
  return rates.empty() ? "-" : absl::StrFormat("%.1f", Median(rates));
}

// The median of the rounds' own ratios: a round runs the two back to back, so each ratio holds two
// runs that met the same machine; the ratio of the medians could pair a kiln run from a minute of
// high bandwidth with a llama.cpp run from a minute of low.
std::string Ratio(const std::vector<double>& kiln, const std::vector<double>& llama) {
  if (kiln.empty() || kiln.size() != llama.size()) return "-";
  std::vector<double> ratios;
  for (size_t i = 0; i < kiln.size(); ++i) ratios.push_back(kiln[i] / llama[i]);
  return absl::StrFormat("%.2f", Median(ratios));
}

std::string Roofline(const std::vector<double>& ratios) {
  return ratios.empty() ? "-" : absl::StrFormat("%.2f", Median(ratios));
}

void PrintTable(const std::vector<FormatRow>& rows, bool with_llama) {
  std::printf("\n%-14s %11s %11s %6s  %10s %10s %6s  %8s %8s\n", "format", "kiln pp", "llama pp",
              "ratio", "kiln tg", "llama tg", "ratio", "kiln rl", "llama rl");
  for (const FormatRow& row : rows) {
    std::printf("%-14s %11s %11s %6s  %10s %10s %6s  %8s %8s\n", row.label.c_str(),
                Rate(row.kiln_prefill).c_str(), Rate(row.llama_prefill).c_str(),
                Ratio(row.kiln_prefill, row.llama_prefill).c_str(), Rate(row.kiln_decode).c_str(),
                Rate(row.llama_decode).c_str(), Ratio(row.kiln_decode, row.llama_decode).c_str(),
                Roofline(row.kiln_roofline).c_str(), Roofline(row.llama_roofline).c_str());
    if (!row.kiln_unavailable.empty()) {
      std::printf("  kiln %s: not available (%s)\n",
                  std::string(QuantizationName(row.kiln_quantization)).c_str(),
                  row.kiln_unavailable.c_str());
    }
    if (with_llama && !row.llama_error.empty()) {
      std::printf("  llama.cpp: not available (%s)\n", row.llama_error.c_str());
    }
  }
  std::printf(
      "\ntokens/s, medians; pp = prefill, tg = batch-1 decode; ratio = kiln ÷ llama.cpp, the "
      "median of the rounds'\nratios (each round runs the two back to back, in turns first);\n"
      "rl = decode roofline: bytes read per token × tg ÷ the read bandwidth probed just before the "
      "run, median\nover rounds (kiln: packed weights and one embedding row; llama.cpp: every "
      "tensor in the file, its\nmodel_size)\n");
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
  return 1;
}

int Main() {
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const int32_t prompt_tokens = absl::GetFlag(FLAGS_prompt_tokens);
  const int32_t decode_tokens = absl::GetFlag(FLAGS_decode_tokens);
  if (prompt_tokens < 1 || decode_tokens < 1) {
    return Fail(absl::InvalidArgumentError("--prompt_tokens and --decode_tokens must be >= 1"));
  }
  const int threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : omp_get_num_procs();
  omp_set_num_threads(threads);  // before the backend exists: oneDNN and kiln's kernels use it

  const std::string llama_bench = absl::GetFlag(FLAGS_llama_bench);
  if (!llama_bench.empty() && ::access(llama_bench.c_str(), X_OK) != 0) {
    return Fail(absl::NotFoundError(
        absl::StrCat("--llama_bench ", llama_bench, ": ", std::strerror(errno))));
  }
  const std::vector<std::string> extra_args =
      absl::StrSplit(absl::GetFlag(FLAGS_llama_bench_args), ' ', absl::SkipEmpty());

  std::filesystem::path checkpoint = absl::GetFlag(FLAGS_model);
  if (checkpoint.empty()) {
    absl::StatusOr<std::filesystem::path> synthesized =
        bench::SynthCheckpoint(absl::GetFlag(FLAGS_preset), "bf16", absl::GetFlag(FLAGS_model_dir));
    if (!synthesized.ok()) return Fail(synthesized.status());
    checkpoint = *synthesized;
  }

  std::vector<FormatRow> rows(3);
  rows[0].label = "bf16", rows[0].gguf = absl::GetFlag(FLAGS_gguf_bf16);
  rows[1].label = "int8 vs q8_0", rows[1].kiln_quantization = Quantization::kInt8;
  rows[1].gguf = absl::GetFlag(FLAGS_gguf_q8_0);
  rows[2].label = "int4 vs q4_0", rows[2].kiln_quantization = Quantization::kInt4;
  rows[2].gguf = absl::GetFlag(FLAGS_gguf_q4_0);
  for (FormatRow& row : rows) {
    if (llama_bench.empty()) continue;
    if (row.gguf.empty()) {
      row.llama_error = "no GGUF file given";
    } else if (absl::Status status = CheckGgufFile(row.gguf); !status.ok()) {
      row.llama_error = std::string(status.message());
    }
  }

  absl::StatusOr<std::unique_ptr<Backend>> created = CreateBackend(absl::GetFlag(FLAGS_backend));
  if (!created.ok()) return Fail(created.status());
  std::shared_ptr<Backend> backend(std::move(*created));
  std::printf("kiln                   %s: %s (%s)\n", checkpoint.c_str(),
              std::string(backend->name()).c_str(), backend->description().c_str());
  if (!llama_bench.empty()) {
    std::printf("llama.cpp              %s -t %d -p %d -n %d -r 1 -o json%s%s\n",
                llama_bench.c_str(), threads, prompt_tokens, decode_tokens,
                extra_args.empty() ? "" : " ", absl::StrJoin(extra_args, " ").c_str());
  }

  std::vector<int32_t> prompt;
  for (FormatRow& row : rows) {
    LoadKilnRow(checkpoint, backend, row);
    if (!row.kiln_model) continue;
    if (prompt.empty()) prompt = SpreadTokens(prompt_tokens, row.kiln_model->config().vocab_size);
    // Warm-up, as llama-bench does its own: first-touch of the KV pool and activation arena.
    if (absl::StatusOr<Throughput> warm = MeasureKiln(*row.kiln_model, prompt, 4); !warm.ok()) {
      row.kiln_unavailable = std::string(warm.status().message());
      row.kiln_model.reset();
    }
  }

  std::printf(
      "%d alternating rounds of prefill %d and decode %d (each from an empty cache), each run "
      "after a read-bandwidth probe",
      repeats, prompt_tokens, decode_tokens);
  std::fflush(stdout);
  // The machine's bandwidth moves (other tenants, clocks) by up to 2× within a minute here, so each
  // run is held against a probe taken just before it, and the two programs take turns going first
  // in a round.
  std::vector<double> bandwidths, round_trips;
  for (int round = 0; round < repeats; ++round) {
    for (FormatRow& row : rows) {
      auto run_kiln = [&]() -> absl::Status {
        if (!row.kiln_model) return absl::OkStatus();
        const double bandwidth = bench::MeasureReadBandwidth(2);
        bandwidths.push_back(bandwidth);
        round_trips.push_back(bench::MeasureThreadRoundTrip());
        KILN_ASSIGN_OR_RETURN(Throughput kiln, MeasureKiln(*row.kiln_model, prompt, decode_tokens));
        row.kiln_prefill.push_back(kiln.prefill), row.kiln_decode.push_back(kiln.decode);
        row.kiln_roofline.push_back(
            static_cast<double>(row.kiln_model->bytes_streamed_per_token()) * kiln.decode /
            bandwidth);
        return absl::OkStatus();
      };
      auto run_llama = [&]() {
        if (llama_bench.empty() || !row.llama_error.empty()) return;
        const double bandwidth = bench::MeasureReadBandwidth(2);
        bandwidths.push_back(bandwidth);
        round_trips.push_back(bench::MeasureThreadRoundTrip());
        absl::StatusOr<LlamaBenchResult> llama = MeasureLlamaCpp(
            llama_bench, row.gguf, threads, prompt_tokens, decode_tokens, extra_args);
        if (!llama.ok()) {
          row.llama_error = std::string(llama.status().message());
          row.llama_prefill.clear(), row.llama_decode.clear();
          return;
        }
        row.llama_prefill.push_back(llama->throughput.prefill);
        row.llama_decode.push_back(llama->throughput.decode);
        row.llama_roofline.push_back(llama->tensor_bytes * llama->throughput.decode / bandwidth);
      };
      if (round % 2 == 1) run_llama();
      if (absl::Status status = run_kiln(); !status.ok()) return Fail(status);
      if (round % 2 == 0) run_llama();
    }
    std::printf(" .");
    std::fflush(stdout);
  }
  std::printf("\n");
  if (!bandwidths.empty()) {
    std::printf(
        "memory read bandwidth  %.2f GB/s median of the runs' probes (%.2f to %.2f), %d threads\n",
        Median(bandwidths) / 1e9, *std::min_element(bandwidths.begin(), bandwidths.end()) / 1e9,
        *std::max_element(bandwidths.begin(), bandwidths.end()) / 1e9, threads);
    std::printf("threads' round trip    %s\n", bench::DescribeRoundTrips(round_trips).c_str());
  }
  PrintTable(rows, !llama_bench.empty());
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  return kiln::Main();
}
