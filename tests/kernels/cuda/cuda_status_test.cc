// The CUDA backend's host side, on every machine with the toolkit: runtime errors become
// statuses with the right codes, and the backend registry says why CUDA cannot run here.
#include "kernels/cuda/cuda_status.h"

#include "gtest/gtest.h"
#include "kernels/backend_registry.h"

namespace kiln::cuda {
namespace {

TEST(CudaStatusTest, ErrorsNameTheCallAndMapToCodes) {
  EXPECT_TRUE(CudaStatus(cudaSuccess, "cudaMalloc").ok());
  const absl::Status oom = CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc(1024 bytes)");
  EXPECT_EQ(oom.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(oom.message().find("cudaMalloc(1024 bytes): cudaErrorMemoryAllocation"),
            absl::string_view::npos)
      << oom;
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "cudaSetDevice").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorNoDevice, "cudaSetDevice").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "cudaMemcpyAsync").code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status launch = CudaStatus(cudaErrorLaunchFailure, "rms_norm<<<>>>");
  EXPECT_EQ(launch.code(), absl::StatusCode::kInternal);
  EXPECT_NE(launch.message().find("cudaErrorLaunchFailure"), absl::string_view::npos) << launch;
}

TEST(CudaStatusTest, TheRegistrySaysWhyCudaIsUnavailable) {
  const std::string no_device = NoDeviceReason();
  const absl::Status status = CheckBackendAvailable("cuda");
  // No build of kiln runs models on CUDA yet: with or without a device it is refused, with
  // the runtime's own reason where there is no device.
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  if (no_device.empty()) {
    EXPECT_FALSE(DeviceDescription().empty());
    EXPECT_NE(status.message().find(DeviceDescription()), absl::string_view::npos) << status;
  } else {
    EXPECT_NE(no_device.find("cudaError"), std::string::npos) << no_device;
    EXPECT_NE(status.message().find(no_device), absl::string_view::npos) << status;
    EXPECT_TRUE(DeviceDescription().empty());
  }
  EXPECT_NE(status.message().find("available: cpu"), absl::string_view::npos) << status;
}

}  // namespace
}  // namespace kiln::cuda
