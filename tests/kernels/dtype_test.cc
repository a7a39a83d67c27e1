#include "kernels/dtype.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace kiln {
namespace {

uint16_t BF16Of(uint32_t f32_bits) { return F32ToBF16(std::bit_cast<float>(f32_bits)); }

TEST(DTypeTest, NamesRoundTrip) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    absl::StatusOr<DType> parsed = DTypeFromName(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_FALSE(DTypeFromName("F64").ok());
  EXPECT_FALSE(DTypeFromName("bf16").ok());
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
}

TEST(DTypeTest, BF16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToBF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBF16(-0.0f), 0x8000);
  // Below / above the halfway point.
  EXPECT_EQ(BF16Of(0x3f807fffu), 0x3f80);
  EXPECT_EQ(BF16Of(0x3f808001u), 0x3f81);
  // Exact ties go to the even mantissa.
  EXPECT_EQ(BF16Of(0x3f808000u), 0x3f80);  // 0x3f80 is even: down
  EXPECT_EQ(BF16Of(0x3f818000u), 0x3f82);  // 0x3f81 is odd: up
  EXPECT_EQ(BF16Of(0xbf818000u), 0xbf82);  // same for negatives
  // Rounding carries into the exponent, and past the largest finite value to infinity.
  EXPECT_EQ(BF16Of(0x3fffffffu), 0x4000);
  EXPECT_EQ(BF16Of(0x7f7fffffu), 0x7f80);
  // Subnormals round like any other value.
  EXPECT_EQ(BF16Of(0x00008000u), 0x0000);
  EXPECT_EQ(BF16Of(0x00018000u), 0x0002);
}

TEST(DTypeTest, BF16SpecialValues) {
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  // NaNs stay NaN (quiet), even those whose payload sits only in the low 16 bits, which plain
  // rounding would turn into infinity.
  for (uint32_t bits : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    const uint16_t bf = BF16Of(bits);
    EXPECT_TRUE(std::isnan(BF16ToF32(bf))) << std::hex << bits;
    EXPECT_EQ(bf & 0x8000u, (bits >> 16) & 0x8000u) << "sign kept for " << std::hex << bits;
  }
}

TEST(DTypeTest, BF16RoundTripsEveryValue) {
  for (uint32_t b = 0; b <= 0xffffu; ++b) {
    const float f = BF16ToF32(static_cast<uint16_t>(b));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(f))));
    } else {
      EXPECT_EQ(F32ToBF16(f), b);
    }
  }
}

TEST(DTypeTest, F16KnownValuesAndRoundTrip) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(1e6f), 0x7c00);                   // overflow to infinity
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x3555), 0.333251953125f);
  // Ties to even: 1 + 2^-11 lies halfway between 1 and 1 + 2^-10.
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(F32ToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f))));
    } else {
      EXPECT_EQ(F32ToF16(f), h);
    }
  }
}

TEST(DTypeTest, BulkConversionsHandleUnalignedBuffers) {
  const int64_t n = 37;
  std::vector<float> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = 0.37f * static_cast<float>(i) - 5.0f;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<std::byte> storage(n * DTypeSize(dtype) + 1);
    std::byte* unaligned = storage.data() + 1;
    ConvertFromF32(dtype, values.data(), n, unaligned);
    std::vector<float> back(n);
    ConvertToF32(dtype, unaligned, n, back.data());
    for (int64_t i = 0; i < n; ++i) {
      float expected = values[i];
      if (dtype == DType::kBF16) expected = BF16ToF32(F32ToBF16(values[i]));
      if (dtype == DType::kF16) expected = F16ToF32(F32ToF16(values[i]));
      EXPECT_EQ(back[i], expected) << i;
    }
  }
}

}  // namespace
}  // namespace kiln
