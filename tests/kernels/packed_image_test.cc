// Packed images (kernels/packed_image.h) on the CPU backend: a linear's image adopted by a later
// pack gives the same outputs bit for bit (from aligned or unaligned bytes); an image the
// backend cannot adopt as asked is unpacked exactly (dense layouts) or to q·scale (quantized) and
// packed as usual. Dense unpacking is exact; quantizing the dequantized weights again gives the
// same bytes, which checks the dequantization against the packer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_registry.h"
#include "kernels/cpu/onednn_images.h"
#include "kernels/cpu/onednn_linear.h"
#include "kernels/cpu/quantized_linear.h"

namespace kiln {
namespace {

std::unique_ptr<Backend> Cpu() {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend("cpu");
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? *std::move(backend) : nullptr;
}

// [n, k] weights ~ N(0, 0.05²) stored as bf16, and a bias.
struct Weights {
  int64_t n = 0;
  int64_t k = 0;
  std::vector<uint16_t> bf16;
  std::vector<float> bias;

  Weights(int64_t rows, int64_t cols, uint32_t seed) : n(rows), k(cols) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    bf16.resize(static_cast<size_t>(n * k));
    for (uint16_t& value : bf16) value = F32ToBF16(normal(rng));
    bias.resize(static_cast<size_t>(n));
    for (float& value : bias) value = normal(rng);
  }
  LinearPackSpec Spec(DType compute, Quantization quantization) const {
    LinearPackSpec spec;
    spec.name = "w";
    spec.row_blocks = {
        WeightView{DType::kBF16, n, k, reinterpret_cast<const std::byte*>(bf16.data())}};
    spec.bias = bias;
    spec.compute_dtype = compute;
    spec.quantization = quantization;
    return spec;
  }
  // The spec of a load that hands the backend `image` instead of the plain weights.
  LinearPackSpec AdoptSpec(DType compute, Quantization quantization,
                           const PackedImage* image) const {
    LinearPackSpec spec = Spec(compute, quantization);
    spec.row_blocks.clear();
    spec.prepacked = image;
    return spec;
  }
};

std::vector<float> Forward(const PackedLinear& linear, const std::vector<float>& x, int64_t m) {
  std::vector<float> y(static_cast<size_t>(m * linear.out_features()));
  absl::Status status = cpu::RunLinear(linear, x.data(), m, y.data());
  EXPECT_TRUE(status.ok()) << status;
  return y;
}

std::vector<float> Input(int64_t m, int64_t k) {
  std::vector<float> x(static_cast<size_t>(m * k));
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.3f * static_cast<float>(i)) + 0.05f;
  return x;
}

// The image's parts copied to 8 bytes past a 64-byte boundary: adoption takes them from anywhere.
struct Misaligned {
  std::vector<std::vector<std::byte>> storage;
  PackedImage image;

  explicit Misaligned(const PackedImage& from) : image(from) {
    for (PackedImage::Part& part : image.parts) {
      std::vector<std::byte>& bytes = storage.emplace_back(part.bytes + 72);
      std::byte* at = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) + 8;
      std::memcpy(at, part.data, part.bytes);
      part.data = at;
    }
  }
};

struct Case {
  DType compute;
  Quantization quantization;
};

class PackedImageTest : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (GetParam().quantization != Quantization::kNone && !cpu::QuantizedKernelSupported()) {
      GTEST_SKIP() << "this CPU has no AVX-512 VNNI: the quantized kernels cannot run here";
    }
  }
};

TEST_P(PackedImageTest, AnAdoptedImageGivesTheSameOutputsBitForBit) {
  const Case c = GetParam();
  std::unique_ptr<Backend> backend = Cpu();
  const Weights w(200, 100, 1);  // N not a multiple of a panel, K not of a block
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed =
      backend->PackLinear(w.Spec(c.compute, c.quantization));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const std::optional<PackedImage> image = (*packed)->Image();
  if (!image.has_value()) {
    GTEST_SKIP() << "oneDNN packs another layout than the panel one on this CPU: no image";
  }
  EXPECT_EQ(image->rows, 200);
  EXPECT_EQ(image->cols, 100);
  EXPECT_EQ(image->quantization, c.quantization);
  EXPECT_FALSE((*packed)->adopted());

  const Misaligned misaligned(*image);
  for (const PackedImage* source : {&*image, &misaligned.image}) {
    LinearPackSpec spec = w.AdoptSpec(c.compute, c.quantization, source);
    absl::StatusOr<std::unique_ptr<PackedLinear>> adopted = backend->PackLinear(spec);
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    EXPECT_TRUE((*adopted)->adopted());
    EXPECT_EQ((*adopted)->packed_bytes(), (*packed)->packed_bytes());
    for (const int64_t m : {1, 3, 8, 17}) {
      const std::vector<float> x = Input(m, 100);
      EXPECT_EQ(Forward(**adopted, x, m), Forward(**packed, x, m)) << "m=" << m;
    }
  }
}

// An image whose bytes outlive the load in 2 MiB pages (PackedImage::backing, in_huge_pages: a
// file mapped by the native loader) is read where it lies; without both, or at an address the
// kernels cannot load from, it is copied. Either way the outputs are the packed linear's.
TEST_P(PackedImageTest, AnImageInHugePagesIsReadWhereItLiesAndOthersAreCopied) {
  const Case c = GetParam();
  std::unique_ptr<Backend> backend = Cpu();
  const Weights w(200, 100, 5);
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed =
      backend->PackLinear(w.Spec(c.compute, c.quantization));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const std::optional<PackedImage> image = (*packed)->Image();
  if (!image.has_value()) GTEST_SKIP() << "no image of this layout on this CPU";

  // The image's bytes copied into storage of their own, which the backing keeps alive.
  auto storage = std::make_shared<std::vector<std::vector<std::byte>>>();
  PackedImage lying = *image;
  for (PackedImage::Part& part : lying.parts) {
    std::vector<std::byte>& bytes = storage->emplace_back(part.bytes + 64);
    std::byte* at = bytes.data() + (64 - reinterpret_cast<uintptr_t>(bytes.data()) % 64) % 64;
    std::memcpy(at, part.data, part.bytes);
    part.data = at;
  }
  const Misaligned misaligned(lying);
  struct Source {
    const char* what;
    PackedImage image;
    bool in_place;
  };
  std::vector<Source> sources = {{"in huge pages", lying, true},
                                 {"not in huge pages", lying, false},
                                 {"without backing", lying, false},
                                 {"misaligned", misaligned.image, false}};
  sources[0].image.backing = storage;
  sources[0].image.in_huge_pages = true;
  sources[1].image.backing = storage;
  sources[1].image.in_huge_pages = false;
  sources[2].image.in_huge_pages = true;
  sources[3].image.backing = storage;
  sources[3].image.in_huge_pages = true;
  for (const Source& source : sources) {
    SCOPED_TRACE(source.what);
    LinearPackSpec spec = w.AdoptSpec(c.compute, c.quantization, &source.image);
    absl::StatusOr<std::unique_ptr<PackedLinear>> adopted = backend->PackLinear(spec);
    ASSERT_TRUE(adopted.ok()) << adopted.status();
    EXPECT_TRUE((*adopted)->adopted());
    EXPECT_EQ((*adopted)->adopted_in_place(), source.in_place);
    const std::optional<PackedImage> kept = (*adopted)->Image();
    ASSERT_TRUE(kept.has_value());
    ASSERT_EQ(kept->parts.size(), source.image.parts.size());
    for (size_t i = 0; i < kept->parts.size(); ++i) {
      EXPECT_EQ(kept->parts[i].data == source.image.parts[i].data, source.in_place)
          << kept->parts[i].name;
    }
    for (const int64_t m : {1, 8, 17}) {
      const std::vector<float> x = Input(m, 100);
      EXPECT_EQ(Forward(**adopted, x, m), Forward(**packed, x, m)) << "m=" << m;
    }
  }
  // A linear read in place keeps its bytes alive: they outlive the caller's handle.
  LinearPackSpec spec = w.AdoptSpec(c.compute, c.quantization, &sources[0].image);
  absl::StatusOr<std::unique_ptr<PackedLinear>> adopted = backend->PackLinear(spec);
  ASSERT_TRUE(adopted.ok()) << adopted.status();
  sources.clear();
  lying.backing.reset();
  const std::weak_ptr<std::vector<std::vector<std::byte>>> watch = storage;
  storage.reset();
  EXPECT_FALSE(watch.expired());
  const std::vector<float> x = Input(3, 100);
  EXPECT_EQ(Forward(**adopted, x, 3), Forward(**packed, x, 3));
  adopted->reset();
  EXPECT_TRUE(watch.expired());
}

TEST_P(PackedImageTest, AnImageAskedForAsAnotherDTypeIsUnpackedAndPackedAsUsual) {
  const Case c = GetParam();
  std::unique_ptr<Backend> backend = Cpu();
  const Weights w(130, 64, 2);
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed =
      backend->PackLinear(w.Spec(c.compute, c.quantization));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const std::optional<PackedImage> image = (*packed)->Image();
  if (!image.has_value()) GTEST_SKIP() << "no image of this layout on this CPU";

  // Dense: the other compute dtype. Quantized: no quantization, in f32.
  const DType other = c.compute == DType::kBF16 && c.quantization == Quantization::kNone
                          ? DType::kF32
                          : (c.quantization == Quantization::kNone ? DType::kBF16 : DType::kF32);
  LinearPackSpec spec = w.AdoptSpec(other, Quantization::kNone, &*image);
  absl::StatusOr<std::unique_ptr<PackedLinear>> unpacked = backend->PackLinear(spec);
  ASSERT_TRUE(unpacked.ok()) << unpacked.status();
  EXPECT_FALSE((*unpacked)->adopted());
  EXPECT_EQ((*unpacked)->compute_dtype(), other);
  EXPECT_EQ((*unpacked)->quantization(), Quantization::kNone);

  const std::vector<float> x = Input(5, 64);
  if (c.quantization == Quantization::kNone) {
    // bf16 → f32 and f32 (holding bf16 values) → bf16 are exact: as packing the bf16 weights.
    absl::StatusOr<std::unique_ptr<PackedLinear>> direct =
        backend->PackLinear(w.Spec(other, Quantization::kNone));
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(Forward(**unpacked, x, 5), Forward(**direct, x, 5));
    return;
  }
  // Quantized: the f32 linear multiplies by q·scale exactly as dequantized.
  absl::StatusOr<std::vector<float>> dequantized = cpu::DequantizeImage(*image);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  const std::vector<float> y = Forward(**unpacked, x, 5);
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t n = 0; n < 130; ++n) {
      double sum = w.bias[n], magnitude = std::fabs(w.bias[n]);
      for (int64_t i = 0; i < 64; ++i) {
        const double term = static_cast<double>(x[r * 64 + i]) * (*dequantized)[n * 64 + i];
        sum += term;
        magnitude += std::fabs(term);
      }
      EXPECT_NEAR(y[r * 130 + n], sum, 1e-5 * magnitude + 1e-6) << r << "," << n;
    }
  }
}

TEST_P(PackedImageTest, UnpackingIsExactOrRequantizesToTheSameBytes) {
  const Case c = GetParam();
  std::unique_ptr<Backend> backend = Cpu();
  const Weights w(96, 160, 3);
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed =
      backend->PackLinear(w.Spec(c.compute, c.quantization));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const std::optional<PackedImage> image = (*packed)->Image();
  if (!image.has_value()) GTEST_SKIP() << "no image of this layout on this CPU";
  if (c.quantization == Quantization::kNone) {
    absl::StatusOr<std::vector<std::byte>> plain = cpu::UnpackOneDnnImage(*image);
    ASSERT_TRUE(plain.ok()) << plain.status();
    std::vector<std::byte> expected(static_cast<size_t>(96 * 160) * DTypeSize(c.compute));
    if (c.compute == DType::kBF16) {
      std::memcpy(expected.data(), w.bf16.data(), expected.size());
    } else {
      for (size_t i = 0; i < w.bf16.size(); ++i) {
        const float value = BF16ToF32(w.bf16[i]);
        std::memcpy(expected.data() + 4 * i, &value, 4);
      }
    }
    EXPECT_EQ(*plain, expected);
    return;
  }
  absl::StatusOr<std::vector<float>> dequantized = cpu::DequantizeImage(*image);
  ASSERT_TRUE(dequantized.ok()) << dequantized.status();
  LinearPackSpec again = w.Spec(c.compute, c.quantization);
  again.row_blocks = {
      WeightView{DType::kF32, 96, 160, reinterpret_cast<const std::byte*>(dequantized->data())}};
  absl::StatusOr<std::unique_ptr<PackedLinear>> requantized = backend->PackLinear(again);
  ASSERT_TRUE(requantized.ok()) << requantized.status();
  const std::optional<PackedImage> second = (*requantized)->Image();
  ASSERT_TRUE(second.has_value());
  ASSERT_EQ(second->parts.size(), image->parts.size());
  for (size_t p = 0; p < image->parts.size(); ++p) {
    ASSERT_EQ(second->parts[p].bytes, image->parts[p].bytes);
    EXPECT_EQ(std::memcmp(second->parts[p].data, image->parts[p].data, image->parts[p].bytes), 0)
        << image->parts[p].name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, PackedImageTest,
                         testing::Values(Case{DType::kBF16, Quantization::kNone},
                                         Case{DType::kF32, Quantization::kNone},
                                         Case{DType::kBF16, Quantization::kInt8},
                                         Case{DType::kBF16, Quantization::kInt4}),
                         [](const testing::TestParamInfo<Case>& info) {
                           return std::string(info.param.quantization == Quantization::kNone
                                                  ? DTypeName(info.param.compute)
                                                  : QuantizationName(info.param.quantization));
                         });

TEST(PackedImageErrorsTest, AnImageOfTheWrongSizeOrLayoutIsAnErrorNamingTheLinear) {
  std::unique_ptr<Backend> backend = Cpu();
  const Weights w(64, 32, 4);
  absl::StatusOr<std::unique_ptr<PackedLinear>> packed =
      backend->PackLinear(w.Spec(DType::kBF16, Quantization::kNone));
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::optional<PackedImage> image = (*packed)->Image();
  if (!image.has_value()) GTEST_SKIP() << "no image of this layout on this CPU";
  LinearPackSpec spec = w.AdoptSpec(DType::kBF16, Quantization::kNone, &*image);
  spec.name = "layers.0.o";

  image->parts[0].bytes -= 2;
  absl::StatusOr<std::unique_ptr<PackedLinear>> short_image = backend->PackLinear(spec);
  ASSERT_FALSE(short_image.ok());
  EXPECT_NE(short_image.status().message().find("bytes"), std::string::npos)
      << short_image.status();

  image->parts[0].bytes += 2;
  image->layout = "cuda.some.layout.v1";
  absl::StatusOr<std::unique_ptr<PackedLinear>> unknown = backend->PackLinear(spec);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("cuda.some.layout.v1"), std::string::npos)
      << unknown.status();
}

}  // namespace
}  // namespace kiln
