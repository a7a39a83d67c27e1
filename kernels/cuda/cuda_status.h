// CUDA runtime errors as absl::Status, and whether this machine can run the CUDA backend. Host
// code only (no kernels): it links the CUDA runtime statically, never the driver stub, so a
// binary built with CUDA still starts on a machine without a driver.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kiln::cuda {

// OK for cudaSuccess; otherwise a status naming `call` and the error, e.g.
// "cudaMalloc(1073741824 bytes): cudaErrorMemoryAllocation: out of memory". Out of memory is
// RESOURCE_EXHAUSTED; a missing driver or device FAILED_PRECONDITION; bad arguments
// INVALID_ARGUMENT; anything else (launch failures, a sticky error) INTERNAL.
absl::Status CudaStatus(cudaError_t error, absl::string_view call);

// Why this process cannot use a GPU ("" when it can): the runtime's answer to
// cudaGetDeviceCount (its return code, not the count: without a driver it is
// cudaErrorInsufficientDriver, with a driver and no GPU cudaErrorNoDevice).
std::string NoDeviceReason();

// "NVIDIA H200 (sm_90, 139.8 GiB)" for device 0; "" when there is none.
std::string DeviceDescription();

}  // namespace kiln::cuda
