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
  # Tensorizer files: ISA-L (CRC32), zlib (combining the CRC32s of pieces), libsodium
  # (XSalsa20-Poly1305, Argon2id)
  libisal-dev zlib1g-dev libsodium-dev
  # metrics endpoint: civetweb (embedded HTTP server); promtool (from prometheus) checks it in tests
  libcivetweb-dev prometheus
  # OpenAI HTTP API and the load generator's HTTP client: Boost.Beast/Asio (header-only)
  libboost-dev
  # tests: GoogleTest, libtorch (the independent reference forward)
  libgtest-dev googletest libtorch-dev
  # end-to-end test (tests/e2e): Debian's Python gRPC and Protobuf for /usr/bin/python3
  python3-grpcio python3-protobuf
  # tools/gguf/safetensors_to_gguf.py (GGUF files for the llama.cpp comparison bench) and its test
  python3-numpy
  # fuzzing (scripts/fuzz.sh, the `fuzz` preset): clang 14 with libFuzzer and the sanitizer
  # runtimes, LLVM's OpenMP runtime for -fopenmp, llvm-symbolizer for readable crash stacks
  clang-14 libclang-rt-14-dev libomp-14-dev llvm-14
)
# The OpenAI SDK end-to-end test (tests/e2e/openai) runs on Node.js: Debian's nodejs and npm,
# unless a Node.js with npm is already installed (another distribution's nodejs package
# conflicts with Debian's npm).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  packages+=(nodejs npm)
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ $status == "install ok installed" ]] || missing+=("$package")
done
if ((${#missing[@]} > 0)); then
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then sudo=(sudo); fi
  echo "setup: installing ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}"
fi

# The npm package the OpenAI e2e test drives the server with, at the version package-lock.json
# pins (from the npm registry; about 2 s).
e2e_openai="$(cd "$(dirname "$0")/../tests/e2e/openai" && pwd)"
if ! node -e "const dir = process.argv[1];
  const want = require(dir + '/package.json').dependencies.openai;
  process.exit(require(dir + '/node_modules/openai/package.json').version === want ? 0 : 1)" \
  "$e2e_openai" 2>/dev/null; then
  echo "setup: npm ci in tests/e2e/openai"
  npm ci --prefix "$e2e_openai" --no-audit --no-fund --loglevel=error
fi
