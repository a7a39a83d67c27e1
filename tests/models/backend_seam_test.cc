// The backend seam's promises, checked with a tracing backend that behaves like a device with
// memory of its own (tests/models/tracing_backend.h): PostLoad prepares everything a forward
// reads, the forward touches nothing else, and a decode step allocates and uploads nothing once
// warm.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "clients/synth.h"
#include "kernels/cpu/step_team.h"
#include "loaders/load_model.h"
#include "models/lifecycle.h"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"
#include "tests/models/tracing_backend.h"

namespace kiln {
namespace {

using testing_util::CpuBackend;
using testing_util::ScratchDir;
using testing_util::TraceCounts;
using testing_util::TracingBackend;

// Qwen3-shaped (q/k norms) and one MTP head, so every op of the main forward and of the draft
// step runs.
ModelConfig SeamConfig() {
  absl::StatusOr<ModelConfig> config = SynthPresetConfig("kiln-tiny");
  EXPECT_TRUE(config.ok());
  config->architecture = Architecture::kQwen3;
  config->architecture_name = "Qwen3ForCausalLM";
  config->qk_norm = true;
  config->num_hidden_layers = 2;
  config->num_mtp_layers = 1;
  return *config;
}

// A copy of a checkpoint's records in one heap buffer the test can overwrite after PostLoad.
struct InMemoryCheckpoint {
  WeightSource source;
  std::shared_ptr<std::vector<std::byte>> bytes;
};

InMemoryCheckpoint CopyIntoMemory(const WeightSource& from) {
  InMemoryCheckpoint copy;
  size_t total = 0;
  for (const TensorRecord& record : from.records()) total += (record.byte_size + 63) / 64 * 64;
  copy.bytes = std::make_shared<std::vector<std::byte>>(total);
  size_t offset = 0;
  for (const TensorRecord& record : from.records()) {
    TensorRecord moved = record;
    moved.data = copy.bytes->data() + offset;
    std::memcpy(copy.bytes->data() + offset, record.data, record.byte_size);
    offset += (record.byte_size + 63) / 64 * 64;
    EXPECT_TRUE(copy.source.Add(std::move(moved)).ok());
  }
  copy.source.provenance() = from.provenance();
  copy.source.KeepAlive(copy.bytes);
  return copy;
}

class BackendSeamTest : public testing::Test {
 protected:
  void SetUp() override {
    SynthOptions options;
    options.dtype = DType::kBF16;
    ASSERT_TRUE(WriteSynthCheckpoint(dir_.path(), SeamConfig(), options).ok());
    tracing_ = std::make_shared<TracingBackend>(CpuBackend());
  }

  // Logits of a prefill of `prompt`, then of `decode_steps` greedy decode steps.
  static std::vector<float> Generate(const PreparedModel& model, int decode_steps) {
    absl::StatusOr<KvCache> cache = model.NewCache(32);
    EXPECT_TRUE(cache.ok()) << cache.status();
    const std::vector<int32_t> prompt = {5, 17, 300, 2, 9, 44};
    std::vector<float> all, logits;
    SequenceChunk chunk{&*cache, prompt, /*all_logits=*/true};
    EXPECT_TRUE(model.Forward({&chunk, 1}, &logits).ok());
    all.insert(all.end(), logits.begin(), logits.end());
    int32_t next = 7;
    for (int i = 0; i < decode_steps; ++i) {
      logits.clear();
      chunk = SequenceChunk{&*cache, {&next, 1}, false};
      EXPECT_TRUE(model.Forward({&chunk, 1}, &logits).ok());
      all.insert(all.end(), logits.begin(), logits.end());
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    return all;
  }

  ScratchDir dir_;
  std::shared_ptr<TracingBackend> tracing_;
};

TEST_F(BackendSeamTest, ForwardReadsOnlyWhatPostLoadPrepared) {
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir_.path(), tracing_);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->backend_name(), "tracing");
  EXPECT_FALSE((*model)->embedding_zero_copy()) << "the backend reads no host memory";
  EXPECT_EQ(tracing_->counts().prepares, 1);
  ASSERT_EQ((*model)->num_mtp_heads(), 1);

  // Prefill, decode, and two MTP draft steps (the first from the main model's hidden states).
  absl::StatusOr<KvCache> cache = (*model)->NewCache(32);
  absl::StatusOr<KvCache> mtp_cache = (*model)->NewMtpCache(32);
  ASSERT_TRUE(cache.ok() && mtp_cache.ok());
  const std::vector<int32_t> prompt = {5, 17, 300, 2};
  std::vector<float> logits, hidden;
  SequenceChunk chunk{&*cache, prompt, false};
  ASSERT_TRUE((*model)->Forward({&chunk, 1}, &logits, &hidden).ok());
  const std::vector<int32_t> next_tokens = {17, 300, 2, 8};
  MtpChunk draft{&*mtp_cache, next_tokens, hidden, false};
  std::vector<float> draft_logits, draft_hidden;
  ASSERT_TRUE((*model)->MtpForward(0, {&draft, 1}, &draft_logits, &draft_hidden).ok());
  const int32_t token = 3;
  const std::vector<float> state(draft_hidden.end() - (*model)->config().hidden_size,
                                 draft_hidden.end());
  MtpChunk again{&*mtp_cache, {&token, 1}, state, false};
  ASSERT_TRUE((*model)->MtpForward(0, {&again, 1}, &draft_logits).ok());
  EXPECT_GT(tracing_->counts().ops, 0);
  EXPECT_TRUE(tracing_->violations().empty())
      << tracing_->violations().size() << " violations, first: " << tracing_->violations()[0];
}

TEST_F(BackendSeamTest, DecodeStepAllocatesAndUploadsNothingOnceWarm) {
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir_.path(), tracing_);
  ASSERT_TRUE(model.ok()) << model.status();
  const TraceCounts after_load = tracing_->counts();
  EXPECT_GT(after_load.allocations, 0);
  EXPECT_GT(after_load.uploads, 0) << "norms, the embedding and the RoPE table are uploaded";

  absl::StatusOr<KvCache> cache = (*model)->NewCache(64);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(tracing_->counts().allocations, after_load.allocations)
      << "a KV cache takes blocks of the pool PostLoad allocated, no memory of its own";
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  std::vector<float> logits;
  SequenceChunk chunk{&*cache, prompt, false};
  ASSERT_TRUE((*model)->Forward({&chunk, 1}, &logits).ok());
  int32_t next = 6;
  for (int warm = 0; warm < 2; ++warm) {
    logits.clear();
    chunk = SequenceChunk{&*cache, {&next, 1}, false};
    ASSERT_TRUE((*model)->Forward({&chunk, 1}, &logits).ok());
  }

  for (int step = 0; step < 5; ++step) {
    const TraceCounts before = tracing_->counts();
    logits.clear();
    chunk = SequenceChunk{&*cache, {&next, 1}, false};
    ASSERT_TRUE((*model)->Forward({&chunk, 1}, &logits).ok());
    const TraceCounts after = tracing_->counts();
    EXPECT_EQ(after.allocations, before.allocations) << "step " << step;
    EXPECT_EQ(after.uploads, before.uploads) << "step " << step;
    EXPECT_EQ(after.copies_from_host, before.copies_from_host) << "step " << step;
    EXPECT_EQ(after.steps, before.steps + 1) << "metadata handed over once per step";
    EXPECT_EQ(after.copies_to_host, before.copies_to_host + 1) << "logits come back once";
    EXPECT_EQ(after.packs, before.packs);
    EXPECT_EQ(logits.size(), static_cast<size_t>((*model)->config().vocab_size));
  }
  EXPECT_EQ(cache->bytes(),
            static_cast<size_t>(cache->blocks().size()) * (*model)->kv_pool().block_bytes());
  EXPECT_EQ(
      static_cast<int64_t>(cache->blocks().size()),
      (cache->length() + (*model)->kv_pool().block_size() - 1) / (*model)->kv_pool().block_size())
      << "blocks follow the length, not the capacity";
  EXPECT_TRUE(tracing_->violations().empty()) << tracing_->violations()[0];
}

TEST_F(BackendSeamTest, SameLogitsAsTheCpuBackend) {
  absl::StatusOr<std::unique_ptr<PreparedModel>> traced = LoadModel(dir_.path(), tracing_);
  absl::StatusOr<std::unique_ptr<PreparedModel>> cpu = LoadModel(dir_.path(), CpuBackend());
  ASSERT_TRUE(traced.ok() && cpu.ok());
  EXPECT_TRUE((*cpu)->embedding_zero_copy()) << "the CPU backend reads the mapped embedding";
  EXPECT_EQ(Generate(**traced, 4), Generate(**cpu, 4));
}

// The CPU backend's decode steps run on a team of threads held for the step
// (kernels/cpu/step_team.h) instead of a parallel region per op: the same logits, bit for bit, in
// bf16 and int4, on a model whose linears are large enough to be split over the threads.
TEST_F(BackendSeamTest, CpuStepTeamChangesNoLogit) {
  ModelConfig config = SeamConfig();
  config.num_mtp_layers = 0;
  config.hidden_size = 512;
  config.intermediate_size = 1536;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 2;
  config.head_dim = 64;
  config.vocab_size = 4096;
  ScratchDir dir;
  SynthOptions options;
  options.dtype = DType::kBF16;
  options.write_tokenizer = false;
  ASSERT_TRUE(WriteSynthCheckpoint(dir.path(), config, options).ok());
  for (Quantization quantize : {Quantization::kNone, Quantization::kInt4}) {
    SCOPED_TRACE(QuantizationName(quantize));
    LoadOptions load;
    load.quantize = quantize;
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        LoadModel(dir.path(), CpuBackend(), load);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<float> with_team = Generate(**model, 6);
    cpu::EnableStepTeams(false);
    const std::vector<float> without_team = Generate(**model, 6);
    cpu::EnableStepTeams(true);
    ASSERT_EQ(with_team.size(), without_team.size());
    EXPECT_EQ(std::memcmp(with_team.data(), without_team.data(), with_team.size() * sizeof(float)),
              0);
  }
}

// An op profile counts every op of a decode step once per call, each linear under its name, and
// changes no result; unset, it records nothing more.
TEST_F(BackendSeamTest, OpProfileCountsEveryOpOfAStep) {
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir_.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<float> plain = Generate(**model, 2);
  OpProfile profile;
  (*model)->set_op_profile(&profile);
  EXPECT_EQ(Generate(**model, 2), plain);
  (*model)->set_op_profile(nullptr);
  const int64_t layers = (*model)->config().num_hidden_layers;
  const int64_t forwards = 3;  // the prefill and two decode steps
  EXPECT_EQ(profile.of(OpKind::kLinear).calls, forwards * (4 * layers + 1));
  EXPECT_EQ(profile.of(OpKind::kAttention).calls, forwards * layers);
  EXPECT_EQ(profile.of(OpKind::kEmbed).calls, forwards);
  EXPECT_EQ(profile.of(OpKind::kCopyToHost).calls, forwards);
  ASSERT_TRUE(profile.by_linear.contains("lm_head"));
  EXPECT_EQ(profile.by_linear.at("lm_head").calls, forwards);
  EXPECT_EQ(profile.by_linear.at("layers.1.gate_up").calls, forwards);
  EXPECT_GT(profile.of(OpKind::kLinear).seconds, 0);
  EXPECT_GE(profile.total_seconds(), profile.of(OpKind::kLinear).seconds);
  const OpProfile recorded = profile;
  Generate(**model, 1);
  EXPECT_EQ(profile.of(OpKind::kLinear).calls, recorded.of(OpKind::kLinear).calls);
}

// The checkpoint's bytes are overwritten with NaN after PostLoad: a forward that reads only what
// PostLoad prepared gives the same logits as before. The CPU backend reads its embedding in
// place, so there the same overwrite shows, which is what makes the test able to fail.
TEST_F(BackendSeamTest, OverwrittenCheckpointBytesDoNotReachTheForward) {
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(dir_.path());
  ASSERT_TRUE(opened.ok()) << opened.status();
  for (bool zero_copy_backend : {false, true}) {
    SCOPED_TRACE(zero_copy_backend ? "cpu backend" : "tracing backend");
    InMemoryCheckpoint copy = CopyIntoMemory(opened->source);
    std::shared_ptr<Backend> backend =
        zero_copy_backend ? CpuBackend() : std::static_pointer_cast<Backend>(tracing_);
    absl::StatusOr<std::unique_ptr<PreparedModel>> model =
        BuildPreparedModel(std::move(copy.source), opened->config, backend);
    ASSERT_TRUE(model.ok()) << model.status();
    const std::vector<float> before = Generate(**model, 3);
    std::fill(copy.bytes->begin(), copy.bytes->end(), std::byte{0xff});  // NaN in F32 and BF16
    const std::vector<float> after = Generate(**model, 3);
    if (zero_copy_backend) {
      EXPECT_NE(after, before);
    } else {
      EXPECT_EQ(after, before);
    }
  }
  EXPECT_TRUE(tracing_->violations().empty()) << tracing_->violations()[0];
}

}  // namespace
}  // namespace kiln
