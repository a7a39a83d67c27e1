#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kiln::cuda {

absl::Status CudaStatus(cudaError_t error, absl::string_view call) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(call, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorNoKernelImageForDevice:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

std::string NoDeviceReason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::StrCat(cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  }
  return count > 0 ? "" : "no CUDA device";
}

std::string DeviceDescription() {
  if (!NoDeviceReason().empty()) return "";
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, 0) != cudaSuccess) return "";
  return absl::StrFormat("%s (sm_%d%d, %.1f GiB)", properties.name, properties.major,
                         properties.minor,
                         static_cast<double>(properties.totalGlobalMem) / (1ull << 30));
}

}  // namespace kiln::cuda
