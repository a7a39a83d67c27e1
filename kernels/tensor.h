// A view of a 2-D tensor in some backend's memory: what the ops of kernels/backend.h take. It
// owns nothing; the memory belongs to a DeviceBuffer (or, for zero-copy weights on a backend
// that reads host memory, to the checkpoint mapping the model keeps alive).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/buffer.h"
#include "kernels/dtype.h"

namespace kiln {

// rows × cols elements of `dtype`; row r starts `r · row_stride` elements after `data`.
// A vector is a 1 × n view. Views of inputs are only read.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // in elements, ≥ cols

  static TensorView Matrix(void* data, DType dtype, Device device, int64_t rows, int64_t cols,
                           int64_t row_stride = -1) {
    return TensorView{data, dtype, device, rows, cols, row_stride < 0 ? cols : row_stride};
  }
  // Host fp32 memory (tests, and host-memory backends).
  static TensorView HostF32(const float* data, int64_t rows, int64_t cols,
                            int64_t row_stride = -1) {
    return Matrix(const_cast<float*>(data), DType::kF32, Device{}, rows, cols, row_stride);
  }

  int64_t elements() const { return rows * cols; }
  bool empty() const { return rows == 0 || cols == 0; }
  // Rows follow each other without gaps.
  bool contiguous() const { return row_stride == cols || rows <= 1; }
  size_t element_bytes() const { return DTypeSize(dtype); }
  // Bytes from the first element to one past the last.
  size_t span_bytes() const {
    return empty() ? 0 : static_cast<size_t>((rows - 1) * row_stride + cols) * element_bytes();
  }
  std::byte* bytes() const { return static_cast<std::byte*>(data); }
  float* f32() const { return static_cast<float*>(data); }
  std::byte* row(int64_t r) const {
    return bytes() + static_cast<size_t>(r * row_stride) * element_bytes();
  }

  // `count` rows from row `first` (no bounds check; ops check shapes).
  TensorView Rows(int64_t first, int64_t count) const {
    TensorView view = *this;
    view.data = row(first);
    view.rows = count;
    return view;
  }
  // `count` columns from column `first` of every row.
  TensorView Cols(int64_t first, int64_t count) const {
    TensorView view = *this;
    view.data = bytes() + static_cast<size_t>(first) * element_bytes();
    view.cols = count;
    return view;
  }

  std::string ShapeString() const;  // "[rows, cols] F32 (stride s) on host"
};

// A view of `rows` × `cols` elements at `byte_offset` of `buffer`.
inline TensorView ViewOf(const DeviceBuffer& buffer, DType dtype, int64_t rows, int64_t cols,
                         size_t byte_offset = 0) {
  return TensorView::Matrix(buffer.data() + byte_offset, dtype, buffer.device(), rows, cols);
}

}  // namespace kiln
