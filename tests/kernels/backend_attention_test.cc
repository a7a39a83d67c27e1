// The KV pool's ops of kernels/backend.h against slow double-precision references
// (backend_ops_fixture.h; instantiated per backend in backend_ops_test.cc): RoPE with the append
// to the paged pool, and attention through block tables, row by row and sequence by sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "tests/kernels/backend_ops_fixture.h"

namespace kiln {
namespace {

using backend_ops_testing::BackendOpsTest;
using backend_ops_testing::kSentinel;
using backend_ops_testing::Random;

// ---- RopeAndAppendKv, Attention --------------------------------------------------------------

struct AttentionCase {
  int64_t n_heads, n_kv_heads, head_dim;
  std::vector<std::pair<int64_t, int64_t>> sequences;  // (rows, start position)
};

std::vector<AttentionCase> AttentionCases() {
  std::vector<AttentionCase> cases;
  // GQA ratios 1, 2 and 7; head_dim 64 and 128; decode after a prefix, prefill from 0, chunked
  // prefill after a prefix, and several sequences of different kinds in one step.
  for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{4, 4}, {4, 2}, {14, 2}, {7, 1}}) {
    for (int64_t head_dim : {64, 128}) {
      cases.push_back({heads, kv_heads, head_dim, {{1, 37}}});
      cases.push_back({heads, kv_heads, head_dim, {{9, 0}}});
      cases.push_back({heads, kv_heads, head_dim, {{5, 11}, {1, 0}, {3, 60}}});
    }
  }
  cases.push_back({14, 2, 64, {{40, 0}}});
  cases.push_back({8, 2, 128, {{17, 120}, {1, 200}}});
  // Many chunks of keys (the CPU kernel's online softmax takes 64 at a time): a speculative
  // verification of 3 tokens deep into a context.
  cases.push_back({14, 2, 64, {{3, 700}}});
  return cases;
}

std::string Describe(const AttentionCase& c) {
  std::string text = std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " heads, " +
                     "head_dim " + std::to_string(c.head_dim) + ", sequences";
  for (auto [rows, start] : c.sequences) {
    text += " " + std::to_string(rows) + "@" + std::to_string(start);
  }
  return text;
}

std::vector<float> InvFreq(int64_t head_dim) {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv.size(); ++i) {
    inv[i] = static_cast<float>(
        1.0 / std::pow(500000.0, 2.0 * static_cast<double>(i) / static_cast<double>(head_dim)));
  }
  return inv;
}

// Written from Hugging Face's apply_rotary_pos_emb: out = x·cos + rotate_half(x)·sin with
// cos/sin = cat(f, f) and rotate_half(x) = cat(−x2, x1). As in HF the angle is the fp32 product
// position · inv_freq; the rest is double. Tolerance 2e-6 absolute for |x| ≤ 1.
double Rotated(const float* head, int64_t j, int64_t head_dim, int32_t position,
               const std::vector<float>& inv_freq) {
  const int64_t half = head_dim / 2;
  const float angle = static_cast<float>(position) * inv_freq[static_cast<size_t>(j % half)];
  const double partner = j < half ? -static_cast<double>(head[j + half]) : head[j - half];
  return head[j] * std::cos(static_cast<double>(angle)) +
         partner * std::sin(static_cast<double>(angle));
}

// Block sizes of the KV pool the attention tests page through: one position per block, a
// typical 16, 5 (blocks that do not divide the sequences' lengths), 32 (a 64-key chunk of
// attention spanning two blocks) and 80 (a block larger than a chunk, which the CPU kernel
// prefetches dimension by dimension).
constexpr int64_t kBlockSizes[] = {1, 16, 5, 32, 80};
// What the pool stores: fp32, and bf16 (half the memory; the ops convert on the way in and out).
constexpr DType kKvDTypes[] = {DType::kF32, DType::kBF16};

TEST_P(BackendOpsTest, RopeAndAppendKvRotatesAndWritesThePool) {
  const int64_t layers = 2;
  const int64_t layer = 1;
  for (const DType kv_dtype : kKvDTypes) {
    for (const int64_t block_size : kBlockSizes) {
      for (const AttentionCase& c : AttentionCases()) {
        SCOPED_TRACE(Describe(c) + ", block size " + std::to_string(block_size) + ", " +
                     std::string(DTypeApiName(kv_dtype)) + " pool");
        const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f};
        const int64_t qkv_dim = shape.qkv_dim();
        int64_t blocks = 2;  // a few the sequences do not use
        for (auto [rows, start] : c.sequences)
          blocks += (rows + start + 3 + block_size - 1) / block_size;
        MakePool(blocks, block_size, layers, shape.kv_dim(), 30, kv_dtype);
        std::vector<std::vector<int32_t>> tables;
        for (auto [rows, start] : c.sequences) tables.push_back(Table(rows + start + 3));
        const std::vector<float> before = DownloadPool();
        const StepMetadata step = Step(c.sequences, tables);
        ASSERT_TRUE(ctx_->BeginStep(step).ok());
        const int64_t rows = step.rows();
        const std::vector<float> x = Random(rows * qkv_dim, 7);
        const std::vector<float> inv_freq = InvFreq(c.head_dim);
        const TensorView qkv = Upload(x, rows, qkv_dim);
        ASSERT_TRUE(
            ctx_->RopeAndAppendKv(qkv, shape, Upload(inv_freq, 1, c.head_dim / 2), layer).ok());
        const std::vector<float> got = Download(qkv);
        for (int64_t r = 0; r < rows; ++r) {
          const int32_t pos = step.positions[static_cast<size_t>(r)];
          for (int64_t h = 0; h < c.n_heads + c.n_kv_heads; ++h) {  // q heads, then k heads
            const float* head = x.data() + r * qkv_dim + h * c.head_dim;
            for (int64_t j = 0; j < c.head_dim; ++j) {
              ASSERT_NEAR(got[r * qkv_dim + h * c.head_dim + j],
                          Rotated(head, j, c.head_dim, pos, inv_freq), 2e-6)
                  << "row " << r << " head " << h << " j " << j;
            }
          }
          for (int64_t i = shape.q_dim() + shape.kv_dim(); i < qkv_dim; ++i) {
            ASSERT_EQ(got[r * qkv_dim + i], x[r * qkv_dim + i]) << "v is not rotated";
          }
        }
        // Layer `layer` of each sequence's new positions holds the rotated k and the v, through
        // its block table; every other value of the pool is as it was.
        std::vector<float> expected = before;
        for (size_t s = 0; s < tables.size(); ++s) {
          const StepSequence& seq = step.sequences[s];
          for (int64_t t = 0; t < seq.rows; ++t) {
            const int64_t row = seq.first_row + t;
            const int64_t p = seq.start_position + t;
            for (int64_t i = 0; i < shape.kv_dim(); ++i) {
              expected[PoolIndex(tables[s], layer, 0, p, i)] =
                  Stored(got[row * qkv_dim + shape.q_dim() + i]);
              expected[PoolIndex(tables[s], layer, 1, p, i)] =
                  Stored(x[row * qkv_dim + shape.q_dim() + shape.kv_dim() + i]);
            }
          }
        }
        ASSERT_EQ(DownloadPool(), expected);
      }
    }
  }
}

// Naive attention in double: for a row at position p and head h, softmax over keys 0 .. p of
// scale·q·k, times v, reading kv head h / group through the sequence's block table. Tolerance
// 6e-6 absolute: outputs are convex combinations of values in [-3, 3] with fp32 scores, exp and
// accumulation (2e-6 per unit of value magnitude). A bf16 pool is held to the same tolerance: the
// reference reads the values the pool holds, which the kernel widens exactly.
TEST_P(BackendOpsTest, AttentionThroughBlockTablesMatchesNaiveReference) {
  const int64_t layers = 3;
  const int64_t layer = 2;
  for (const DType kv_dtype : kKvDTypes) {
    for (const int64_t block_size : kBlockSizes) {
      for (const AttentionCase& c : AttentionCases()) {
        SCOPED_TRACE(Describe(c) + ", block size " + std::to_string(block_size) + ", " +
                     std::string(DTypeApiName(kv_dtype)) + " pool");
        const AttentionShape shape{c.n_heads, c.n_kv_heads, c.head_dim,
                                   1.0f / std::sqrt(static_cast<float>(c.head_dim))};
        const int64_t qkv_dim = shape.qkv_dim();
        const int64_t kv_dim = shape.kv_dim();
        int64_t blocks = 2;
        for (auto [rows, start] : c.sequences)
          blocks += (rows + start + 2 + block_size - 1) / block_size;
        MakePool(blocks, block_size, layers, kv_dim, 40, kv_dtype);
        std::vector<std::vector<int32_t>> tables;
        for (auto [rows, start] : c.sequences) tables.push_back(Table(rows + start + 2));
        const std::vector<float> contents = DownloadPool();
        const StepMetadata step = Step(c.sequences, tables);
        ASSERT_TRUE(ctx_->BeginStep(step).ok());
        const int64_t rows = step.rows();
        // Scaled up so that the softmax is far from uniform.
        const std::vector<float> x = Random(rows * qkv_dim, 21, -3.0f, 3.0f);
        const TensorView out = Filled(rows, shape.q_dim(), shape.q_dim() + 3);
        ASSERT_TRUE(ctx_->Attention(Upload(x, rows, qkv_dim), shape, layer, out).ok());
        const std::vector<float> got = Download(out);
        const int64_t group = c.n_heads / c.n_kv_heads;
        for (size_t s = 0; s < tables.size(); ++s) {
          const StepSequence& seq = step.sequences[s];
          for (int64_t t = 0; t < seq.rows; ++t) {
            const int64_t row = seq.first_row + t;
            const int64_t len = seq.start_position + t + 1;
            for (int64_t h = 0; h < c.n_heads; ++h) {
              const int64_t kv_offset = (h / group) * c.head_dim;
              std::vector<double> scores(static_cast<size_t>(len));
              double max_score = -1e300;
              for (int64_t p = 0; p < len; ++p) {
                double dot = 0.0;
                for (int64_t i = 0; i < c.head_dim; ++i) {
                  dot += static_cast<double>(x[row * qkv_dim + h * c.head_dim + i]) *
                         contents[PoolIndex(tables[s], layer, 0, p, kv_offset + i)];
                }
                scores[static_cast<size_t>(p)] = dot * shape.scale;
                max_score = std::max(max_score, scores[static_cast<size_t>(p)]);
              }
              double sum = 0.0;
              for (double& score : scores) sum += (score = std::exp(score - max_score));
              for (int64_t i = 0; i < c.head_dim; ++i) {
                double expected = 0.0;
                for (int64_t p = 0; p < len; ++p) {
                  expected += scores[static_cast<size_t>(p)] / sum *
                              contents[PoolIndex(tables[s], layer, 1, p, kv_offset + i)];
                }
                ASSERT_NEAR(got[row * out.row_stride + h * c.head_dim + i], expected, 6e-6)
                    << "row " << row << " head " << h << " i " << i;
              }
            }
            for (int64_t i = shape.q_dim(); i < out.row_stride; ++i) {
              ASSERT_EQ(got[row * out.row_stride + i], kSentinel) << "padding";
            }
          }
        }
      }
    }
  }
}

// Speculative verification runs k + 1 rows of a sequence in one step and keeps the tokens only
// where they equal what decoding one row at a time would have chosen: a row's attention output
// must not depend on the rows beside it, bit for bit (GQA 3 and 7; contexts across chunks).
TEST_P(BackendOpsTest, AttentionOfEachRowEqualsTheRowAlone) {
  const int64_t layers = 1;
  for (const DType kv_dtype : kKvDTypes) {
    for (auto [heads, kv_heads, rows, start] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t>{6, 2, 4, 61},
          {14, 2, 9, 120},
          {4, 4, 3, 0}}) {
      SCOPED_TRACE(testing::Message() << heads << "/" << kv_heads << " heads, " << rows << "@"
                                      << start << ", " << DTypeApiName(kv_dtype) << " pool");
      const AttentionShape shape{heads, kv_heads, 64, 0.125f};
      MakePool((rows + start) / 16 + 2, 16, layers, shape.kv_dim(), 7, kv_dtype);
      const std::vector<int32_t> table = Table(rows + start);
      const std::vector<float> x = Random(rows * shape.qkv_dim(), 9, -3.0f, 3.0f);
      ASSERT_TRUE(ctx_->BeginStep(Step({{rows, start}}, {table})).ok());
      const TensorView together = Filled(rows, shape.q_dim());
      ASSERT_TRUE(ctx_->Attention(Upload(x, rows, shape.qkv_dim()), shape, 0, together).ok());
      const std::vector<float> all = Download(together);
      for (int64_t t = 0; t < rows; ++t) {
        ASSERT_TRUE(ctx_->BeginStep(Step({{1, start + t}}, {table})).ok());
        const std::vector<float> row(x.begin() + t * shape.qkv_dim(),
                                     x.begin() + (t + 1) * shape.qkv_dim());
        const TensorView alone = Filled(1, shape.q_dim());
        ASSERT_TRUE(ctx_->Attention(Upload(row, 1, shape.qkv_dim()), shape, 0, alone).ok());
        const std::vector<float> got = Download(alone);
        for (int64_t i = 0; i < shape.q_dim(); ++i) {
          ASSERT_EQ(got[static_cast<size_t>(i)], all[static_cast<size_t>(t * shape.q_dim() + i)])
              << "row " << t << " value " << i;
        }
      }
    }
  }
}

// A step of many sequences (batched decode, prefill beside decode) hands all their attention to
// the threads at once: each sequence's rows must be the bits it gets in a step of its own.
TEST_P(BackendOpsTest, AttentionOfEachSequenceEqualsTheSequenceAlone) {
  const std::vector<std::pair<int64_t, int64_t>> sequences = {{1, 0}, {1, 5},  {4, 61}, {1, 130},
                                                              {9, 0}, {1, 33}, {1, 17}, {2, 200}};
  for (const DType kv_dtype : kKvDTypes) {
    for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{14, 2}, {6, 2}}) {
      SCOPED_TRACE(testing::Message()
                   << heads << "/" << kv_heads << " heads, " << DTypeApiName(kv_dtype) << " pool");
      const AttentionShape shape{heads, kv_heads, 64, 0.125f};
      int64_t blocks = 2;
      for (auto [rows, start] : sequences) blocks += (rows + start + 15) / 16;
      MakePool(blocks, 16, 1, shape.kv_dim(), 11, kv_dtype);
      std::vector<std::vector<int32_t>> tables;
      for (auto [rows, start] : sequences) tables.push_back(Table(rows + start));
      const StepMetadata step = Step(sequences, tables);
      const int64_t rows = step.rows();
      const std::vector<float> x = Random(rows * shape.qkv_dim(), 13, -3.0f, 3.0f);
      ASSERT_TRUE(ctx_->BeginStep(step).ok());
      const TensorView together = Filled(rows, shape.q_dim());
      ASSERT_TRUE(ctx_->Attention(Upload(x, rows, shape.qkv_dim()), shape, 0, together).ok());
      const std::vector<float> all = Download(together);
      for (size_t s = 0; s < sequences.size(); ++s) {
        const StepSequence& seq = step.sequences[s];
        ASSERT_TRUE(ctx_->BeginStep(Step({sequences[s]}, {tables[s]})).ok());
        const std::vector<float> own(x.begin() + seq.first_row * shape.qkv_dim(),
                                     x.begin() + (seq.first_row + seq.rows) * shape.qkv_dim());
        const TensorView alone = Filled(seq.rows, shape.q_dim());
        ASSERT_TRUE(ctx_->Attention(Upload(own, seq.rows, shape.qkv_dim()), shape, 0, alone).ok());
        const std::vector<float> got = Download(alone);
        for (int64_t i = 0; i < seq.rows * shape.q_dim(); ++i) {
          ASSERT_EQ(got[static_cast<size_t>(i)],
                    all[static_cast<size_t>(seq.first_row * shape.q_dim() + i)])
              << "sequence " << s << " value " << i;
        }
      }
    }
  }
}

TEST_P(BackendOpsTest, AttentionOpsRefuseLayersAndShapesTheCacheDoesNotHave) {
  const AttentionShape shape{4, 2, 64, 0.125f};
  MakePool(4, 4, 2, shape.kv_dim(), 3);
  ASSERT_TRUE(ctx_->BeginStep(Step({{2, 0}}, {Table(8)})).ok());
  const TensorView qkv = Filled(2, shape.qkv_dim());
  const TensorView inv_freq = Upload(InvFreq(64), 1, 32);
  absl::Status status = ctx_->RopeAndAppendKv(qkv, shape, inv_freq, 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("layer 2"), std::string::npos) << status;
  const AttentionShape other{4, 4, 64, 0.125f};
  EXPECT_EQ(ctx_->Attention(Filled(2, other.qkv_dim()), other, 0, Filled(2, other.q_dim())).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ctx_->RopeAndAppendKv(qkv, shape, Upload(InvFreq(64), 1, 16), 0).code(),
            absl::StatusCode::kInvalidArgument)
      << "RoPE table of the wrong width";
  EXPECT_EQ(ctx_->Attention(Filled(3, shape.qkv_dim()), shape, 0, Filled(3, shape.q_dim())).code(),
            absl::StatusCode::kInvalidArgument)
      << "more rows than the step";
}

}  // namespace
}  // namespace kiln
