#include "kernels/cpu/onednn_primitives.h"

#include <cstring>
#include <new>
#include <utility>

namespace kiln::cpu::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// Up to this M, bf16 prefers the AVX-512 brgemm over the AMX one (see PrimitiveCache::Create).
constexpr int64_t kPreferAvx512MaxM = 4;

thread_local ThreadState tls_state;

bool IsAmx(const std::string& impl) { return impl.find("amx") != std::string::npos; }

dnnl::matmul::desc MakeDesc(const PrimKey& key) {
  const Dt dt = ToDnnl(key.dtype);
  const memory::desc src_md({key.m, key.k}, dt, Tag::ab);
  const memory::desc weights_md({key.k, key.n}, dt, Tag::any);
  const memory::desc dst_md({key.m, key.n}, Dt::f32, Tag::ab);
  if (!key.bias) return dnnl::matmul::desc(src_md, weights_md, dst_md);
  const memory::desc bias_md({1, key.n}, Dt::f32, Tag::ab);
  return dnnl::matmul::desc(src_md, weights_md, bias_md, dst_md);
}

}  // namespace

HostBytes AllocAligned(size_t bytes) {
  void* p = AllocateHost(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return HostBytes(static_cast<std::byte*>(p));
}

std::byte* GrowBuffer::Get(size_t bytes) {
  if (bytes > capacity_ || !data_) {
    data_ = AllocAligned(bytes);
    capacity_ = bytes;
  }
  return data_.get();
}

ThreadState& ThisThreadState() { return tls_state; }

dnnl::stream& ThreadStream(const dnnl::engine& engine) {
  ThreadState& ts = tls_state;
  if (!ts.stream || ts.engine.get(true) != engine.get()) {
    ts.stream = dnnl::stream();
    ts.engine = engine;
    ts.stream = dnnl::stream(engine);
  }
  return ts.stream;
}

void F32BytesToBF16(const std::byte* src, int64_t n, uint16_t* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, src + 4 * i, 4);
    const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const uint32_t nan = (bits >> 16) | 0x40u;
    dst[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
  }
}

void ConvertBlock(const WeightView& block, DType compute, std::byte* dst) {
  const int64_t cols = block.cols;
  const size_t src_row_bytes = static_cast<size_t>(cols) * DTypeSize(block.dtype);
  const size_t dst_row_bytes = static_cast<size_t>(cols) * DTypeSize(compute);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < block.rows; ++r) {
    const std::byte* s = block.data + static_cast<size_t>(r) * src_row_bytes;
    std::byte* d = dst + static_cast<size_t>(r) * dst_row_bytes;
    if (block.dtype == compute) {
      std::memcpy(d, s, src_row_bytes);
    } else if (compute == DType::kF32) {
      ConvertToF32(block.dtype, s, cols, reinterpret_cast<float*>(d));
    } else if (block.dtype == DType::kF32) {
      F32BytesToBF16(s, cols, reinterpret_cast<uint16_t*>(d));
    } else {  // f16 -> bf16, through f32 (exact), then one rounding
      for (int64_t c = 0; c < cols; ++c) {
        uint16_t bits;
        std::memcpy(&bits, s + 2 * c, 2);
        const uint16_t out = F32ToBF16(F16ToF32(bits));
        std::memcpy(d + 2 * c, &out, 2);
      }
    }
  }
}

dnnl::memory::data_type ToDnnl(DType dtype) { return dtype == DType::kBF16 ? Dt::bf16 : Dt::f32; }

std::shared_ptr<const PrimEntry> PrimitiveCache::Get(const PrimKey& key) {
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = map_.find(key);
    if (it != map_.end()) return it->second;
  }
  std::shared_ptr<const PrimEntry> created = Create(key);  // slow (JIT); outside the lock
  absl::MutexLock lock(&mu_);
  return map_.emplace(key, std::move(created)).first->second;
}

std::shared_ptr<const PrimEntry> PrimitiveCache::Create(const PrimKey& key) const {
  // The op desc must outlive the primitive_desc iteration (oneDNN 2.6 keeps a pointer to it).
  const dnnl::matmul::desc desc = MakeDesc(key);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::matmul::primitive_desc pd(desc, attr, engine_);
  // oneDNN's first choice for bf16 here is the AMX brgemm even at M = 1, but for M ≤ 4 the
  // AVX-512 brgemm streams the weights faster (measured on this 2-core VM, weights not in
  // cache, K=896 N=9728: 17 vs 13 GB/s at M=1; K=4864 N=896: 16.5 vs 12.7; lm_head
  // N=151936: 15 vs 12). From M = 8 on AMX wins by 1.5-5x. Take the AVX-512 one for small M
  // when it wants the same weight layout.
  if (key.m <= kPreferAvx512MaxM && IsAmx(pd.impl_info_str())) {
    dnnl::matmul::primitive_desc alt(desc, attr, engine_);
    while (alt.next_impl()) {
      const std::string impl = alt.impl_info_str();
      if (impl.rfind("brg:", 0) != 0 || IsAmx(impl)) continue;
      if (alt.weights_desc() == pd.weights_desc()) pd = alt;
      break;
    }
  }
  auto entry = std::make_shared<PrimEntry>();
  entry->m = key.m;
  entry->primitive = dnnl::matmul(pd);
  entry->src_md = pd.src_desc();
  entry->dst_md = pd.dst_desc();
  entry->weights_md = pd.weights_desc();
  entry->scratch_md = pd.scratchpad_desc();
  entry->scratch_bytes = entry->scratch_md.get_size();
  entry->impl = pd.impl_info_str();
  return entry;
}

}  // namespace kiln::cpu::onednn
