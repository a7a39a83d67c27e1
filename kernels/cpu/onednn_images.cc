#include "kernels/cpu/onednn_images.h"

#include <algorithm>
#include <iterator>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kiln::cpu {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;

memory::data_type ToDnnl(DType dtype) {
  return dtype == DType::kBF16 ? memory::data_type::bf16 : memory::data_type::f32;
}

}  // namespace

absl::StatusOr<std::vector<std::byte>> UnpackOneDnnImage(const PackedImage& image) {
  const auto it =
      std::find_if(std::begin(kPanelLayouts), std::end(kPanelLayouts),
                   [&](const PanelLayout& layout) { return layout.name == image.layout; });
  if (it == std::end(kPanelLayouts)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown packed layout ", image.layout));
  }
  const DType dtype = it->dtype;
  const PackedImage::Part* weights = image.Find("weights");
  if (image.dtype != dtype || image.quantization != Quantization::kNone || weights == nullptr ||
      image.rows <= 0 || image.cols <= 0 || image.rows > (int64_t{1} << 40) / image.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("packed image in ", image.layout, " has a wrong dtype, shape or parts"));
  }
  try {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    const memory::desc packed_md({image.cols, image.rows}, ToDnnl(dtype), it->tag);
    if (weights->bytes != packed_md.get_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("packed image in ", image.layout, " of [", image.rows, ", ", image.cols,
                       "] has ", weights->bytes, " bytes, not ", packed_md.get_size()));
    }
    std::vector<std::byte> plain(static_cast<size_t>(image.rows * image.cols) * DTypeSize(dtype));
    memory src(packed_md, engine, const_cast<std::byte*>(weights->data));  // read only
    memory dst(memory::desc({image.cols, image.rows}, ToDnnl(dtype), Tag::ba), engine,
               plain.data());
    dnnl::stream stream(engine);
    dnnl::reorder(src, dst).execute(stream, src, dst);
    stream.wait();
    return plain;
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("unpacking ", image.layout, ": ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("unpacking ", image.layout, ": out of memory"));
  }
}

}  // namespace kiln::cpu
