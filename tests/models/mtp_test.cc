// MTP heads: restoration from the carried set in every supported layout, accounting, and the
// MTP draft step against the libtorch reference of docs/mtp.md's formula.
//
// Tolerance (fp32 weights, fp32 compute): max |Δlogit| ≤ 1e-4 × max(1, max |reference logit|),
// as for the main forward (kiln and the reference differ only in summation order).
#include <torch/types.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_join.h"
#include "engine/engine.h"
#include "engine/mtp_draft_source.h"
#include "gtest/gtest.h"
#include "loaders/load_model.h"
#include "loaders/safetensors_writer.h"
#include "loaders/tensorizer_checkpoint.h"
#include "models/bind.h"
#include "models/lifecycle.h"
#include "tests/engine/stream_collector.h"
#include "tests/loaders/test_util.h"
#include "tests/models/cpu_backend.h"
#include "tests/reference/torch_reference.h"

namespace kiln {
namespace {

using testing_util::CpuBackend;
using testing_util::ScratchDir;
using Weights = std::map<std::string, torch::Tensor>;

constexpr double kTolerance = 1e-4;

ModelConfig LlamaConfig() {
  ModelConfig c;
  c.architecture = Architecture::kLlama;
  c.architecture_name = "LlamaForCausalLM";
  c.hidden_size = 64, c.intermediate_size = 96, c.num_hidden_layers = 2;
  c.num_attention_heads = 4, c.num_key_value_heads = 2, c.head_dim = 16;
  c.vocab_size = 300, c.max_position_embeddings = 256, c.rms_norm_eps = 1e-5;
  return c;
}

ModelConfig Qwen3Config() {
  ModelConfig c = LlamaConfig();
  c.architecture = Architecture::kQwen3;
  c.architecture_name = "Qwen3ForCausalLM";
  c.head_dim = 32, c.qk_norm = true, c.tie_word_embeddings = true, c.rms_norm_eps = 1e-6;
  return c;
}

ModelConfig Qwen2Config() {
  ModelConfig c = LlamaConfig();
  c.architecture = Architecture::kQwen2;
  c.architecture_name = "Qwen2ForCausalLM";
  c.qkv_bias = true, c.tie_word_embeddings = true, c.rope_theta = 1000000.0;
  return c;
}

ReferenceMtpHead DeepSeekHead(int64_t layer) {
  const std::string p = absl::StrCat("model.layers.", layer, ".");
  return {p + "enorm.weight",
          p + "hnorm.weight",
          p + "eh_proj.weight",
          p + "shared_head.norm.weight",
          p,
          false,
          true,
          false};
}

ReferenceMtpHead Qwen3NextHead(int64_t index) {
  return {"mtp.pre_fc_norm_embedding.weight",
          "mtp.pre_fc_norm_hidden.weight",
          "mtp.fc.weight",
          "mtp.norm.weight",
          absl::StrCat("mtp.layers.", index, "."),
          false,
          false,
          true};
}

ReferenceMtpHead MiMoHead(int64_t index) {
  const std::string p = absl::StrCat("model.mtp_layers.", index, ".");
  return {p + "token_layernorm.weight",
          p + "hidden_layernorm.weight",
          p + "input_proj.weight",
          p + "final_layernorm.weight",
          p,
          true,
          true,
          true};
}

enum class Storage { kInline, kSidecar, kFusedNames };

struct MtpCase {
  std::string name;
  ModelConfig config;
  std::vector<ReferenceMtpHead> heads;
  std::string head_name;  // what report.restored names head 0
  Storage storage = Storage::kInline;
  bool deepseek_copies = false;  // also ship embed_tokens / shared_head.head copies
};

void PrintTo(const MtpCase& c, std::ostream* os) { *os << c.name; }

std::vector<MtpCase> Cases() {
  ModelConfig llama = LlamaConfig();
  llama.num_mtp_layers = 1;
  ModelConfig llama2 = llama;
  llama2.num_mtp_layers = 2;
  ModelConfig qwen3 = Qwen3Config();
  qwen3.num_mtp_layers = 1;
  ModelConfig mimo = Qwen2Config();
  mimo.num_mtp_layers = 1;
  ModelConfig fused = llama;
  fused.qkv_bias = fused.o_proj_bias = true;
  return {
      {"deepseek_inline", llama, {DeepSeekHead(2)}, "mtp.0 (deepseek)", Storage::kInline, true},
      {"deepseek_sidecar_two_heads",
       llama2,
       {DeepSeekHead(2), DeepSeekHead(3)},
       "mtp.0 (deepseek)",
       Storage::kSidecar,
       true},
      {"qwen3_next_qk_norm", qwen3, {Qwen3NextHead(0)}, "mtp.0 (qwen3-next)"},
      {"mimo_qwen2_biases", mimo, {MiMoHead(0)}, "mtp.0 (mimo)"},
      {"deepseek_fused_engine_names_biases",
       fused,
       {DeepSeekHead(2)},
       "mtp.0 (deepseek)",
       Storage::kFusedNames},
  };
}

std::vector<TensorToWrite> ToWrite(const Weights& weights) {
  std::vector<TensorToWrite> out;
  for (const auto& [name, t] : weights) {
    EXPECT_TRUE(t.is_contiguous() && t.scalar_type() == torch::kFloat) << name;
    out.push_back(
        {name, DType::kF32, t.sizes().vec(),
         std::span<const std::byte>(static_cast<const std::byte*>(t.data_ptr()), t.nbytes())});
  }
  return out;
}

// The block of `prefix` renamed to the engine layout: q/k/v and gate/up fused.
Weights FuseBlock(const Weights& mtp, const std::string& prefix) {
  Weights out;
  auto take = [&](const std::string& suffix) { return mtp.at(prefix + suffix); };
  for (const auto& [name, t] : mtp) {
    const bool fused_part = name.find("self_attn.q_proj") != std::string::npos ||
                            name.find("self_attn.k_proj") != std::string::npos ||
                            name.find("self_attn.v_proj") != std::string::npos ||
                            name.find("mlp.gate_proj") != std::string::npos ||
                            name.find("mlp.up_proj") != std::string::npos;
    if (!fused_part) out[name] = t;
  }
  out[prefix + "self_attn.qkv_proj.weight"] =
      torch::cat({take("self_attn.q_proj.weight"), take("self_attn.k_proj.weight"),
                  take("self_attn.v_proj.weight")})
          .contiguous();
  if (mtp.contains(prefix + "self_attn.q_proj.bias")) {
    out[prefix + "self_attn.qkv_proj.bias"] =
        torch::cat({take("self_attn.q_proj.bias"), take("self_attn.k_proj.bias"),
                    take("self_attn.v_proj.bias")})
            .contiguous();
  }
  out[prefix + "mlp.gate_up_proj.weight"] =
      torch::cat({take("mlp.gate_proj.weight"), take("mlp.up_proj.weight")}).contiguous();
  return out;
}

// Writes the case's checkpoint; returns every weight in Hugging Face names (for the reference)
// and, in `mtp_names`, the names of the MTP tensors as written.
Weights WriteCase(const MtpCase& c, const std::filesystem::path& dir,
                  std::set<std::string>* mtp_names) {
  Weights main = RandomHfWeights(c.config, /*seed=*/77, DType::kF32);
  Weights mtp;
  for (size_t i = 0; i < c.heads.size(); ++i) {
    AddRandomMtpWeights(c.config, c.heads[i], 900 + i, DType::kF32, mtp);
    if (c.deepseek_copies) {
      const std::string& p = c.heads[i].block_prefix;
      mtp[p + "embed_tokens.weight"] = main.at("model.embed_tokens.weight").clone();
      mtp[p + "shared_head.head.weight"] =
          (c.config.tie_word_embeddings ? main.at("model.embed_tokens.weight")
                                        : main.at("lm_head.weight"))
              .clone();
    }
  }
  Weights all = main;
  all.insert(mtp.begin(), mtp.end());
  Weights written_mtp = mtp;
  if (c.storage == Storage::kFusedNames) {
    for (const ReferenceMtpHead& head : c.heads) {
      written_mtp = FuseBlock(written_mtp, head.block_prefix);
    }
  }
  for (const auto& [name, t] : written_mtp) mtp_names->insert(name);
  if (c.storage == Storage::kSidecar) {
    // Sharded main weights plus an off-index mtp.safetensors (GLM-4.7 style).
    EXPECT_TRUE(WriteHfCheckpoint(dir, c.config, main, 64 * 1024).ok());
    EXPECT_TRUE(WriteSafetensorsFile(dir / "mtp.safetensors", ToWrite(written_mtp)).ok());
  } else {
    Weights to_write = main;
    to_write.insert(written_mtp.begin(), written_mtp.end());
    EXPECT_TRUE(WriteHfCheckpoint(dir, c.config, to_write, uint64_t{1} << 30).ok());
  }
  return all;
}

torch::Tensor AsTensor(std::vector<float>& values, int64_t rows, int64_t cols) {
  EXPECT_EQ(values.size(), static_cast<size_t>(rows * cols));
  return torch::from_blob(values.data(), {rows, cols}, torch::kFloat).clone();
}

void ExpectClose(const torch::Tensor& actual, const torch::Tensor& expected, const char* what) {
  const double scale = std::max(1.0, expected.abs().max().item<double>());
  const double diff = MaxAbsDiff(actual, expected);
  EXPECT_LE(diff, kTolerance * scale) << what << ": max |Δ| " << diff << " at scale " << scale;
}

class MtpLayoutTest : public ::testing::TestWithParam<MtpCase> {};

TEST_P(MtpLayoutTest, RestoresEveryTensorAndMatchesReference) {
  const MtpCase& c = GetParam();
  ScratchDir dir;
  std::set<std::string> mtp_names;
  const Weights weights = WriteCase(c, dir.path(), &mtp_names);
  const uint64_t runs = PostLoadRunCount();
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(PostLoadRunCount(), runs + 1);
  const PreparedModel& model = **loaded;
  const LoadReport& report = model.report();

  // Accounting: every MTP tensor restored, to its head; nothing unplaced; no warnings.
  EXPECT_TRUE(report.unplaced.empty()) << report.Summary();
  EXPECT_TRUE(report.warnings.empty()) << report.Summary();
  std::set<std::string> restored;
  for (const TensorSummary& t : report.restored) {
    restored.insert(t.name);
    EXPECT_TRUE(t.head.find("mtp.") == 0) << t.name << " -> " << t.head;
  }
  EXPECT_EQ(restored, mtp_names);
  for (const TensorSummary& t : report.restored) {
    if (t.name.rfind(c.heads[0].block_prefix, 0) == 0) {
      EXPECT_EQ(t.head, c.head_name) << t.name;
    }
  }
  ASSERT_EQ(model.num_mtp_heads(), static_cast<int>(c.heads.size()));
  EXPECT_EQ(model.mtp_head_info(0).name, c.head_name);
  if (c.storage == Storage::kSidecar) {
    const std::vector<std::string>& files = model.provenance().files;
    EXPECT_NE(std::find(files.begin(), files.end(), "mtp.safetensors"), files.end());
  }

  // The main model gives h_0..h_{n-1}; each head drafts twice: over the n positions at once,
  // then one more position from its own greedy draft and hidden output.
  const int64_t hidden = c.config.hidden_size;
  const int64_t vocab = c.config.vocab_size;
  std::vector<int32_t> ids;
  for (int i = 0; i < 10; ++i) ids.push_back((i * 53 + 11) % static_cast<int>(vocab));
  const int64_t n = static_cast<int64_t>(ids.size()) - 1;
  const std::vector<int64_t> prompt(ids.begin(), ids.end() - 1);
  const std::vector<int64_t> next(ids.begin() + 1, ids.end());
  absl::StatusOr<KvCache> cache = model.NewCache(32);
  ASSERT_TRUE(cache.ok());
  std::vector<float> main_logits, main_hidden;
  const std::vector<int32_t> prompt32(ids.begin(), ids.end() - 1);
  SequenceChunk chunk{&*cache, prompt32, true};
  ASSERT_TRUE(model.Forward({&chunk, 1}, &main_logits, &main_hidden).ok());
  const torch::Tensor ref_hidden = ReferenceFinalHidden(c.config, weights, prompt);
  ExpectClose(AsTensor(main_hidden, n, hidden), ref_hidden, "main hidden");

  for (int head = 0; head < model.num_mtp_heads(); ++head) {
    SCOPED_TRACE(model.mtp_head_info(head).name);
    absl::StatusOr<KvCache> mtp_cache = model.NewMtpCache(32);
    ASSERT_TRUE(mtp_cache.ok());
    const std::vector<int32_t> next32(ids.begin() + 1, ids.end());
    std::vector<float> logits1, hidden1;
    MtpChunk step1{&*mtp_cache, next32, main_hidden, true};
    ASSERT_TRUE(model.MtpForward(head, {&step1, 1}, &logits1, &hidden1).ok());
    EXPECT_EQ(mtp_cache->length(), n);
    const ReferenceMtpOutput ref1 =
        ReferenceMtpStep(c.config, weights, c.heads[head], next, ref_hidden);
    ExpectClose(AsTensor(logits1, n, vocab), ref1.logits, "draft step 1 logits");
    ExpectClose(AsTensor(hidden1, n, hidden), ref1.next_hidden, "draft step 1 hidden");
    // The comparison is sensitive to the layout's concat order, the position-0 embedding rule
    // and which hidden state feeds the next step.
    for (auto flip :
         {+[](ReferenceMtpHead& h) { h.hidden_first = !h.hidden_first; },
          +[](ReferenceMtpHead& h) { h.zero_embedding_at_start = !h.zero_embedding_at_start; },
          +[](ReferenceMtpHead& h) { h.next_hidden_normed = !h.next_hidden_normed; }}) {
      ReferenceMtpHead wrong = c.heads[head];
      flip(wrong);
      const ReferenceMtpOutput off = ReferenceMtpStep(c.config, weights, wrong, next, ref_hidden);
      EXPECT_GT(MaxAbsDiff(AsTensor(logits1, n, vocab), off.logits) +
                    MaxAbsDiff(AsTensor(hidden1, n, hidden), off.next_hidden),
                0.01);
    }

    const torch::Tensor l1 = AsTensor(logits1, n, vocab);
    const int32_t draft = static_cast<int32_t>(l1[n - 1].argmax().item<int64_t>());
    const std::vector<int32_t> draft_ids = {draft};
    std::vector<float> logits2;
    MtpChunk step2{&*mtp_cache, draft_ids,
                   std::span<const float>(hidden1).subspan(static_cast<size_t>((n - 1) * hidden),
                                                           static_cast<size_t>(hidden)),
                   false};
    ASSERT_TRUE(model.MtpForward(head, {&step2, 1}, &logits2).ok());
    std::vector<int64_t> next2 = next;
    next2.push_back(draft);
    const torch::Tensor hidden2 =
        torch::cat({ref_hidden, ref1.next_hidden.slice(0, n - 1, n)}, 0).contiguous();
    const ReferenceMtpOutput ref2 =
        ReferenceMtpStep(c.config, weights, c.heads[head], next2, hidden2);
    ExpectClose(AsTensor(logits2, 1, vocab), ref2.logits.slice(0, n, n + 1), "draft step 2 logits");
  }
}

// Generates greedily through an engine; returns every request's tokens and adds up its
// speculative stats.
std::vector<std::vector<int32_t>> GenerateGreedy(std::shared_ptr<const PreparedModel> model,
                                                 std::shared_ptr<DraftSource> drafts,
                                                 int32_t num_draft_tokens,
                                                 SpeculativeStats* stats) {
  EngineOptions options;
  options.draft_source = std::move(drafts);
  options.max_context = 64;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model, nullptr, options);
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {7}, {5, 9, 11, 13, 17, 19}};
  std::vector<std::unique_ptr<StreamCollector>> streams;
  for (const std::vector<int32_t>& prompt : prompts) {
    GenerationRequest request;
    request.prompt = prompt;
    request.stopping.max_tokens = 12;
    request.stopping.ignore_eos = true;
    request.num_draft_tokens = num_draft_tokens;
    streams.push_back(std::make_unique<StreamCollector>());
    absl::StatusOr<uint64_t> id = (*engine)->Submit(request, streams.back()->Callback());
    EXPECT_TRUE(id.ok()) << id.status();
  }
  std::vector<std::vector<int32_t>> outputs;
  for (const std::unique_ptr<StreamCollector>& stream : streams) {
    stream->Wait(absl::Seconds(60));
    absl::MutexLock lock(&stream->mutex);
    EXPECT_TRUE(stream->last.has_value() && stream->last->status.ok());
    if (stream->last.has_value()) {
      stats->drafted += stream->last->speculative.drafted;
      stats->accepted += stream->last->speculative.accepted;
    }
    outputs.push_back(stream->tokens);
  }
  return outputs;
}

// The engine drafting with the restored heads (engine/mtp_draft_source.h) gives exactly the
// plain greedy output, whatever the (random-weight) heads propose.
TEST_P(MtpLayoutTest, GreedySpeculativeEqualsPlainGreedy) {
  const MtpCase& c = GetParam();
  ScratchDir dir;
  std::set<std::string> mtp_names;
  WriteCase(c, dir.path(), &mtp_names);
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const PreparedModel> model(std::move(*loaded));
  absl::StatusOr<std::shared_ptr<MtpDraftSource>> drafts = MtpDraftSource::Create(model);
  ASSERT_TRUE(drafts.ok()) << drafts.status();
  SpeculativeStats plain_stats;
  const std::vector<std::vector<int32_t>> plain = GenerateGreedy(model, nullptr, 0, &plain_stats);
  for (int32_t k : {1, 3}) {
    SCOPED_TRACE(::testing::Message() << "k = " << k);
    SpeculativeStats stats;
    EXPECT_EQ(GenerateGreedy(model, *drafts, k, &stats), plain);
    EXPECT_GT(stats.drafted, 0);
    EXPECT_LE(stats.accepted, stats.drafted);
  }
  EXPECT_EQ(plain_stats.drafted, 0);
}

// The draft source feeds head 0 (context[p + 1], h_p) for exactly the positions p the target
// computed, then chains its own drafts: its proposals equal head steps run from scratch.
TEST_P(MtpLayoutTest, DraftSourceProposesTheHeadsGreedyChain) {
  const MtpCase& c = GetParam();
  ScratchDir dir;
  std::set<std::string> mtp_names;
  WriteCase(c, dir.path(), &mtp_names);
  absl::StatusOr<std::unique_ptr<PreparedModel>> loaded = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::shared_ptr<const PreparedModel> model(std::move(*loaded));
  const int64_t hidden_size = c.config.hidden_size;
  const int64_t vocab = c.config.vocab_size;

  // The target prefills the prompt and picks the next token; its hidden rows cover positions
  // 0..4, the context is prompt + that token.
  std::vector<int32_t> context = {3, 1, 4, 1, 5};
  absl::StatusOr<KvCache> cache = model->NewCache(32);
  ASSERT_TRUE(cache.ok());
  SequenceChunk chunk{&*cache, context, false};
  std::vector<float> logits, hidden;
  ASSERT_TRUE(model->Forward({&chunk, 1}, &logits, &hidden).ok());
  context.push_back(
      static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));

  absl::StatusOr<std::shared_ptr<MtpDraftSource>> source = MtpDraftSource::Create(model);
  ASSERT_TRUE(source.ok());
  absl::StatusOr<std::unique_ptr<DraftSession>> session =
      (*source)->StartSession({.context = context, .max_length = 32});
  ASSERT_TRUE(session.ok()) << session.status();
  absl::StatusOr<Draft> draft =
      (*session)->Propose(3, context, HiddenStates{0, hidden_size, hidden});
  ASSERT_TRUE(draft.ok()) << draft.status();
  ASSERT_EQ(draft->tokens.size(), 3u);

  // From scratch: head 0 over positions 0..4, then the chain (head s % heads at step s).
  std::vector<KvCache> caches;
  for (int h = 0; h < model->num_mtp_heads(); ++h) caches.push_back(*model->NewMtpCache(32));
  std::vector<float> head_logits, head_hidden;
  MtpChunk first{&caches[0], std::span<const int32_t>(context).subspan(1), hidden, false};
  ASSERT_TRUE(model->MtpForward(0, {&first, 1}, &head_logits, &head_hidden).ok());
  std::vector<int32_t> expected;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> last(head_logits.end() - vocab, head_logits.end());
    expected.push_back(
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
    if (step == 2) break;
    const int head = (step + 1) % model->num_mtp_heads();
    const std::vector<float> state(head_hidden.end() - hidden_size, head_hidden.end());
    head_logits.clear();
    head_hidden.clear();
    MtpChunk next{&caches[static_cast<size_t>(head)], {&expected.back(), 1}, state, false};
    ASSERT_TRUE(model->MtpForward(head, {&next, 1}, &head_logits, &head_hidden).ok());
  }
  EXPECT_EQ(draft->tokens, expected);
  EXPECT_TRUE(draft->probs.empty());  // greedy drafts
}

INSTANTIATE_TEST_SUITE_P(Layouts, MtpLayoutTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<MtpCase>& info) {
                           return info.param.name;
                         });

// Batching two sequences in one MTP step gives what each gives alone.
TEST(MtpTest, BatchedChunksMatchSeparateRuns) {
  MtpCase c = Cases()[0];
  ScratchDir dir;
  std::set<std::string> names;
  WriteCase(c, dir.path(), &names);
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  const int64_t hidden = c.config.hidden_size;
  const std::vector<int32_t> a = {5, 17, 42, 9}, b = {100, 3};
  std::vector<float> ha(a.size() * hidden), hb(b.size() * hidden);
  for (size_t i = 0; i < ha.size(); ++i) ha[i] = std::sin(0.1f * static_cast<float>(i));
  for (size_t i = 0; i < hb.size(); ++i) hb[i] = std::cos(0.2f * static_cast<float>(i));
  auto run = [&](std::vector<std::pair<const std::vector<int32_t>*, std::vector<float>*>> seqs) {
    std::vector<KvCache> caches;
    std::vector<MtpChunk> chunks;
    for (size_t i = 0; i < seqs.size(); ++i) caches.push_back(*(*model)->NewMtpCache(8));
    for (size_t i = 0; i < seqs.size(); ++i) {
      chunks.push_back({&caches[i], *seqs[i].first, *seqs[i].second, true});
    }
    std::vector<float> logits;
    EXPECT_TRUE((*model)->MtpForward(0, chunks, &logits).ok());
    return logits;
  };
  std::vector<float> together = run({{&a, &ha}, {&b, &hb}});
  std::vector<float> alone_a = run({{&a, &ha}});
  std::vector<float> alone_b = run({{&b, &hb}});
  alone_a.insert(alone_a.end(), alone_b.begin(), alone_b.end());
  ASSERT_EQ(together.size(), alone_a.size());
  for (size_t i = 0; i < together.size(); ++i) ASSERT_NEAR(together[i], alone_a[i], 1e-4) << i;
}

TEST(MtpTest, BadCallsAreErrors) {
  MtpCase c = Cases()[0];
  ScratchDir dir;
  std::set<std::string> names;
  WriteCase(c, dir.path(), &names);
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<KvCache> cache = (*model)->NewMtpCache(4);
  ASSERT_TRUE(cache.ok());
  const std::vector<int32_t> tokens = {1, 2};
  std::vector<float> short_hidden(c.config.hidden_size);
  std::vector<float> logits;
  MtpChunk chunk{&*cache, tokens, short_hidden, true};
  EXPECT_FALSE((*model)->MtpForward(0, {&chunk, 1}, &logits).ok());
  EXPECT_FALSE((*model)->MtpForward(1, {&chunk, 1}, &logits).ok());
  EXPECT_EQ(cache->length(), 0);
}

// A native tensorized file (engine layout: fused main layers, carried tensors under their own
// names) restores the same heads, which give the same drafts.
TEST(MtpTest, NativeTensorizedRoundTripKeepsTheHeads) {
  MtpCase c = Cases()[0];
  ScratchDir dir;
  std::set<std::string> names;
  WriteCase(c, dir / "st", &names);
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(dir / "st");
  ASSERT_TRUE(opened.ok()) << opened.status();
  ASSERT_TRUE(WriteNativeTensorized(dir / "m.tensors", opened->source, opened->config, {}).ok());
  absl::StatusOr<std::unique_ptr<PreparedModel>> original = LoadModel(dir / "st", CpuBackend());
  absl::StatusOr<std::unique_ptr<PreparedModel>> native =
      LoadModel(dir / "m.tensors", CpuBackend());
  ASSERT_TRUE(original.ok()) << original.status();
  ASSERT_TRUE(native.ok()) << native.status();
  EXPECT_EQ((*native)->provenance().layout, WeightLayout::kEngine);
  EXPECT_EQ((*native)->num_mtp_heads(), 1);
  EXPECT_TRUE((*native)->report().unplaced.empty()) << (*native)->report().Summary();
  EXPECT_TRUE((*native)->report().warnings.empty()) << (*native)->report().Summary();
  EXPECT_EQ((*native)->report().restored.size(), names.size());

  const std::vector<int32_t> tokens = {7, 8, 9};
  std::vector<float> hidden(tokens.size() * c.config.hidden_size);
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = std::sin(0.3f * static_cast<float>(i));
  std::vector<float> logits[2];
  const PreparedModel* models[2] = {original->get(), native->get()};
  for (int m = 0; m < 2; ++m) {
    absl::StatusOr<KvCache> cache = models[m]->NewMtpCache(8);
    ASSERT_TRUE(cache.ok());
    MtpChunk chunk{&*cache, tokens, hidden, true};
    ASSERT_TRUE(models[m]->MtpForward(0, {&chunk, 1}, &logits[m]).ok());
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) ASSERT_NEAR(logits[0][i], logits[1][i], 1e-5);
}

// Small checkpoints for the accounting tests: Llama main weights plus a DeepSeek head at layer 2.
struct Checkpoint {
  ModelConfig config = LlamaConfig();
  Weights weights;

  Checkpoint() {
    weights = RandomHfWeights(config, 5, DType::kF32);
    AddRandomMtpWeights(config, DeepSeekHead(2), 6, DType::kF32, weights);
  }
  void Write(const std::filesystem::path& dir) const {
    ASSERT_TRUE(WriteHfCheckpoint(dir, config, weights, uint64_t{1} << 30).ok());
  }
};

TEST(MtpAccountingTest, StrayTensorIsUnplacedNextToARestoredHead) {
  ScratchDir dir;
  Checkpoint ckpt;
  ckpt.config.num_mtp_layers = 1;
  ckpt.weights["model.layers.2.mystery.weight"] = torch::ones({3});
  ckpt.weights["vision_tower.proj.weight"] = torch::ones({2, 2});
  ckpt.Write(dir.path());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  const LoadReport& report = (*model)->report();
  EXPECT_EQ((*model)->num_mtp_heads(), 1);
  std::set<std::string> unplaced;
  for (const TensorSummary& t : report.unplaced) unplaced.insert(t.name);
  EXPECT_EQ(unplaced,
            (std::set<std::string>{"model.layers.2.mystery.weight", "vision_tower.proj.weight"}));
  EXPECT_EQ(report.carried.size(), report.restored.size() + report.unplaced.size());
  EXPECT_TRUE(report.warnings.empty()) << report.Summary();
}

TEST(MtpAccountingTest, AdvertisedButAbsentHeadWarnsAndLoads) {
  ScratchDir dir;
  Checkpoint ckpt;
  ckpt.config.num_mtp_layers = 1;
  ckpt.weights = RandomHfWeights(ckpt.config, 5, DType::kF32);
  ckpt.Write(dir.path());
  const uint64_t runs = PostLoadRunCount();
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(PostLoadRunCount(), runs + 1);
  EXPECT_EQ((*model)->num_mtp_heads(), 0);
  EXPECT_FALSE((*model)->NewMtpCache(4).ok());
  ASSERT_EQ((*model)->report().warnings.size(), 1u);
  EXPECT_CONTAINS((*model)->report().warnings[0], "advertises 1 MTP layers");
}

TEST(MtpAccountingTest, UnadvertisedHeadIsRestoredWithAWarning) {
  ScratchDir dir;
  Checkpoint ckpt;  // num_mtp_layers = 0
  ckpt.Write(dir.path());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->num_mtp_heads(), 1);
  EXPECT_TRUE((*model)->report().unplaced.empty());
  ASSERT_EQ((*model)->report().warnings.size(), 1u);
  EXPECT_CONTAINS((*model)->report().warnings[0], "does not advertise");
}

TEST(MtpAccountingTest, IncompleteHeadIsUnplacedWithAWarning) {
  ScratchDir dir;
  Checkpoint ckpt;
  ckpt.config.num_mtp_layers = 1;
  ckpt.weights.erase("model.layers.2.hnorm.weight");
  ckpt.weights.erase("model.layers.2.mlp.down_proj.weight");
  ckpt.Write(dir.path());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_TRUE(model.ok()) << model.status();
  const LoadReport& report = (*model)->report();
  EXPECT_EQ((*model)->num_mtp_heads(), 0);
  EXPECT_TRUE(report.restored.empty());
  EXPECT_EQ(report.unplaced.size(), report.carried.size());
  const std::string all = absl::StrJoin(report.warnings, "\n");
  EXPECT_CONTAINS(all, "model.layers.2.hnorm.weight");
  EXPECT_CONTAINS(all, "model.layers.2.mlp.down_proj.weight");
  EXPECT_CONTAINS(all, "advertises 1 MTP layers");
}

TEST(MtpAccountingTest, ShapeMismatchNamesTheTensor) {
  ScratchDir dir;
  Checkpoint ckpt;
  ckpt.weights["model.layers.2.eh_proj.weight"] = torch::zeros({64, 64});
  ckpt.Write(dir.path());
  absl::StatusOr<std::unique_ptr<PreparedModel>> model = LoadModel(dir.path(), CpuBackend());
  ASSERT_FALSE(model.ok());
  EXPECT_CONTAINS(model.status().message(), "model.layers.2.eh_proj.weight");
  EXPECT_CONTAINS(model.status().message(), "[64, 128]");

  ScratchDir dir2;
  Checkpoint block;
  block.weights["model.layers.2.self_attn.k_proj.weight"] = torch::zeros({16, 64});
  block.Write(dir2.path());
  model = LoadModel(dir2.path(), CpuBackend());
  ASSERT_FALSE(model.ok());
  EXPECT_CONTAINS(model.status().message(), "model.layers.2.self_attn.k_proj.weight");
}

TEST(MtpAccountingTest, RestoreWorksOnTheCarriedSetDirectly) {
  ScratchDir dir;
  Checkpoint ckpt;
  ckpt.config.num_mtp_layers = 1;
  ckpt.Write(dir.path());
  absl::StatusOr<OpenedCheckpoint> opened = OpenCheckpoint(dir.path());
  ASSERT_TRUE(opened.ok()) << opened.status();
  absl::StatusOr<BoundModel> bound = Bind(std::move(opened->source), opened->config);
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_FALSE(bound->carried.empty());
  ASSERT_TRUE(RestoreCarried(*bound).ok());
  ASSERT_EQ(bound->mtp_heads.size(), 1u);
  EXPECT_EQ(bound->report.restored.size(), bound->carried.size());
  for (const TensorSummary& t : bound->report.restored) EXPECT_EQ(t.head, "mtp.0 (deepseek)");
  EXPECT_NE(bound->mtp_heads[0].proj, nullptr);
  EXPECT_NE(bound->mtp_heads[0].block[static_cast<int>(ParamRole::kQ)], nullptr);
}

TEST(MtpConfigTest, ParsesBothKeysAndWritesOne) {
  const std::string base = ModelConfigToJson(LlamaConfig());
  EXPECT_EQ(base.find("num_nextn_predict_layers"), std::string::npos);
  for (const char* key : {"num_nextn_predict_layers", "mtp_num_hidden_layers"}) {
    std::string text = base;
    text.insert(text.find('{') + 1, absl::StrCat("\"", key, "\": 2,"));
    absl::StatusOr<ModelConfig> config = ParseModelConfig(text);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->num_mtp_layers, 2) << key;
    absl::StatusOr<ModelConfig> again = ParseModelConfig(ModelConfigToJson(*config));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->num_mtp_layers, 2);
  }
  absl::StatusOr<ModelConfig> absent = ParseModelConfig(base);
  ASSERT_TRUE(absent.ok());
  EXPECT_EQ(absent->num_mtp_layers, 0);
  std::string bad = base;
  bad.insert(bad.find('{') + 1, "\"num_nextn_predict_layers\": -1,");
  EXPECT_FALSE(ParseModelConfig(bad).ok());
}

}  // namespace
}  // namespace kiln
