#!/usr/bin/env bash
# Installs every Debian bookworm package kiln's build, tests and benchmarks need.
# Idempotent: when everything is installed it only checks (well under a second).
set -euo pipefail

packages=(
  # toolchain
  g++ cmake ninja-build ccache pkg-config git
  # gRPC + Protobuf (the server's API)
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  # oneDNN (CPU GEMM); its CMake config needs the OpenCL headers and ICD loader
  libdnnl-dev ocl-icd-opencl-dev opencl-headers
  # abseil (Status, flags, strings, containers), glog (logging), JSON, OpenSSL (SHA-256)
  libabsl-dev libgoogle-glog-dev nlohmann-json3-dev libssl-dev
  # tokenizers: PCRE2 (split regexes), utf8proc (Unicode normalization), simdjson (fast tokenizer.json)
  libpcre2-dev libutf8proc-dev libsimdjson-dev
  # Tensorizer files: ISA-L (CRC32), libsodium (XSalsa20-Poly1305, Argon2id)
  libisal-dev libsodium-dev
  # metrics endpoint: civetweb (embedded HTTP server); promtool (from prometheus) checks it in tests
  libcivetweb-dev prometheus
  # tests: GoogleTest, libtorch (the independent reference forward)
  libgtest-dev googletest libtorch-dev
  # end-to-end test (tests/e2e): Debian's Python gRPC and Protobuf for /usr/bin/python3
  python3-grpcio python3-protobuf
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

sudo=()
if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
echo "setup: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
