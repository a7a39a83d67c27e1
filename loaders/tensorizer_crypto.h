// Decryption for tensorizer files (§9 of shared/docs/tensorizer-format.md): libsodium
// XSalsa20-Poly1305 secretbox pieces with little-endian incrementing nonces, and Argon2 key
// derivation (crypto_pwhash) from a passphrase. Secrets live in heap buffers that are zeroed on
// destruction and never copied by moves; nothing here logs them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "loaders/tensorizer_format.h"

namespace kiln::tensorizer {

// A 32-byte secretbox key. Move-only; zeroed on destruction.
class SecretKey {
 public:
  explicit SecretKey(std::span<const uint8_t, kKeyBytes> bytes);
  ~SecretKey();
  SecretKey(SecretKey&&) noexcept = default;
  SecretKey& operator=(SecretKey&&) noexcept = default;
  SecretKey(const SecretKey&) = delete;
  SecretKey& operator=(const SecretKey&) = delete;
  const uint8_t* data() const { return bytes_->data(); }

 private:
  std::unique_ptr<std::array<uint8_t, kKeyBytes>> bytes_;
};

// What the caller knows about an encrypted file's key: exactly one of a raw 32-byte key (vLLM's
// --encryption-keyfile contents) or a passphrase (derived per record with the file's Argon2
// parameters). A raw key also opens records that carry key derivation parameters. Move-only;
// the secret is zeroed on destruction.
class DecryptionKey {
 public:
  // `bytes32` should hold 32 bytes; another length is reported when the key is used.
  static DecryptionKey FromRawKey(std::string bytes32);
  static DecryptionKey FromPassphrase(std::string passphrase);
  ~DecryptionKey();
  DecryptionKey(DecryptionKey&&) noexcept;
  DecryptionKey& operator=(DecryptionKey&&) noexcept;
  DecryptionKey(const DecryptionKey&) = delete;
  DecryptionKey& operator=(const DecryptionKey&) = delete;

  bool is_passphrase() const { return passphrase_; }
  // The raw key or passphrase bytes.
  std::span<const uint8_t> secret() const;

 private:
  struct Secret;
  DecryptionKey(std::string& secret, bool passphrase);
  std::unique_ptr<Secret> secret_;
  bool passphrase_ = false;
};

// Upper bounds on the Argon2 parameters a file may ask for, so a crafted file cannot make key
// derivation take unbounded memory or time (libsodium's "sensitive" preset is 4 passes, 1 GiB).
inline constexpr uint64_t kMaxOpsLimit = 64;
inline constexpr uint64_t kMaxMemLimit = uint64_t{4} << 30;

// Initializes libsodium once per process.
absl::Status EnsureSodium();

// crypto_pwhash(out, 32, passphrase, salt, opslimit, memlimit, alg) with a record's parameters.
// InvalidArgument for parameters libsodium or the bounds above refuse.
absl::StatusOr<SecretKey> DeriveKey(std::span<const uint8_t> passphrase, const KeyDerivation& kd);

// Derived keys by (salt, opslimit, memlimit, alg): every encrypted record repeats the parameters,
// and each derivation can cost a second and hundreds of MiB. Thread-safe.
class KeyCache {
 public:
  absl::StatusOr<const SecretKey*> Get(std::span<const uint8_t> passphrase,
                                       const KeyDerivation& kd);

 private:
  using Params = std::tuple<std::string, uint64_t, uint64_t, int32_t>;
  std::mutex mu_;
  std::map<Params, std::unique_ptr<SecretKey>> keys_;
};

using Nonce = std::array<uint8_t, kNonceBytes>;
// The nonce of piece `index`: `initial` + index as a little-endian 192-bit integer, i.e. `initial`
// after `index` calls of sodium_increment.
Nonce ChunkNonce(const Nonce& initial, uint64_t index);
// sodium_increment on `nonce` (exposed so tests can check ChunkNonce against it).
void IncrementNonce(Nonce& nonce);

// crypto_secretbox_open_detached: decrypts `size` bytes of `in` into `out` (may be the same
// buffer). False when the MAC does not authenticate (wrong key or corrupted data).
bool OpenDetached(std::byte* out, const std::byte* in, size_t size, const uint8_t mac[kMacBytes],
                  const Nonce& nonce, const SecretKey& key);
// crypto_secretbox_detached: the inverse, for writers and tests.
void SealDetached(std::byte* out, const std::byte* in, size_t size, uint8_t mac[kMacBytes],
                  const Nonce& nonce, const SecretKey& key);

}  // namespace kiln::tensorizer
