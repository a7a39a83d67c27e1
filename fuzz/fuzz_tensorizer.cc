// Tensorizer `.tensors` files: the input is a whole file. TensorizerFile::Open validates the
// file header, the metadata index and every record header; ReadAll then decrypts (with the fixed
// raw key of tests/data/tensorizer/edge_cases_encrypted_rawkey.key) and checks the stored
// CRC32/SHA-256, once skipping the hashes so that mutated data still reaches decoding; last, the
// checkpoint layer detects the kind (raw, vLLM, native) and maps names, with the tiny Llama
// config.json beside the file.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "fuzz/fuzz_util.h"
#include "loaders/tensorizer_checkpoint.h"
#include "loaders/tensorizer_reader.h"

namespace {

namespace tz = kiln::tensorizer;

struct Fixture {
  std::filesystem::path file;
  std::string raw_key;
};

const Fixture& GetFixture() {
  static const Fixture fixture = [] {
    Fixture f;
    const std::filesystem::path dir = kiln::fuzz::ScratchDir() / "tensorizer";
    std::filesystem::create_directories(dir);
    kiln::fuzz::WriteFileOrDie(
        dir / "config.json", kiln::fuzz::ReadSourceFileOrDie("tests/data/llama_tiny/config.json"));
    f.file = dir / "model.tensors";
    f.raw_key =
        kiln::fuzz::ReadSourceFileOrDie("tests/data/tensorizer/edge_cases_encrypted_rawkey.key");
    return f;
  }();
  return fixture;
}

void ReadTensors(const tz::TensorizerFile& file, tz::HashCheck hash_check, const std::string& key) {
  tz::ReadOptions options;
  options.hash_check = hash_check;
  options.key = tz::DecryptionKey::FromRawKey(key);
  options.threads = 1;  // libFuzzer runs one input at a time; threads only add noise
  absl::StatusOr<std::vector<tz::TensorBytes>> tensors = file.ReadAll(options);
  if (!tensors.ok()) return;
  for (const tz::TensorBytes& tensor : *tensors) kiln::fuzz::TouchBytes({tensor.data, tensor.size});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& fixture = GetFixture();
  kiln::fuzz::WriteFileOrDie(fixture.file, kiln::fuzz::AsStringView(data, size));

  absl::StatusOr<tz::TensorizerFile> file = tz::TensorizerFile::Open(fixture.file);
  if (!file.ok()) return 0;
  for (const tz::TensorInfo& info : file->tensors()) {
    if (file->Find(info.name) != &info) __builtin_trap();  // the index must find every tensor
  }
  ReadTensors(*file, tz::HashCheck::kNone, fixture.raw_key);
  ReadTensors(*file, tz::HashCheck::kAll, fixture.raw_key);

  kiln::TensorizerCheckpointOptions options;
  options.hash_check = tz::HashCheck::kNone;
  options.encryption_key = fixture.raw_key;
  absl::StatusOr<kiln::TensorizerCheckpoint> checkpoint =
      kiln::OpenTensorizerCheckpoint(fixture.file, options);
  if (checkpoint.ok()) {
    for (const kiln::TensorRecord& record : checkpoint->source.records()) {
      kiln::fuzz::TouchBytes({record.data, record.byte_size});
    }
  }
  return 0;
}
