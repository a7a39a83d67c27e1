# Every dependency comes from a Debian bookworm package; scripts/setup.sh installs them.
find_package(absl REQUIRED)
find_package(dnnl REQUIRED)
find_package(OpenMP REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(Threads REQUIRED)
find_package(glog 0.6 REQUIRED)
find_package(simdjson REQUIRED)
find_package(PkgConfig REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
# Boost.Beast and Boost.Asio (header-only, libboost-dev): the OpenAI HTTP API and the load
# generator's HTTP client, asynchronous so that a few threads carry hundreds of streams.
find_package(Boost 1.74 REQUIRED)
# What code including Beast links: GCC 12 reports -Wmaybe-uninitialized inside Beast's parser
# (boost::optional members, at -O2 with the sanitizers), in code inlined into kiln's files where
# the system-header exemption no longer applies.
add_library(kiln_beast INTERFACE)
target_link_libraries(kiln_beast INTERFACE Boost::headers)
target_compile_options(kiln_beast INTERFACE -Wno-maybe-uninitialized)

if(KILN_BUILD_TESTS)
  find_package(GTest REQUIRED)
  # libtorch provides the independent reference forward used by the tests.
  find_package(Torch REQUIRED)
endif()

set(KILN_HAVE_CUDA OFF)
if(NOT KILN_ENABLE_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(KILN_HAVE_CUDA ON)
    # H100/H200; the CMake default (75) is too old and "native" fails without a GPU.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # The runtime is linked statically and the driver stub never: a CUDA build still starts on
    # a machine without the NVIDIA driver (and then reports why the backend is unavailable).
    find_package(CUDAToolkit REQUIRED)
  elseif(KILN_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KILN_ENABLE_CUDA=ON but no CUDA toolkit was found")
  endif()
endif()
message(STATUS "kiln: CUDA toolkit ${KILN_HAVE_CUDA}")
