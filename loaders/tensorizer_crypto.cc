#include "loaders/tensorizer_crypto.h"

#include <sodium.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kiln::tensorizer {

static_assert(crypto_secretbox_KEYBYTES == kKeyBytes);
static_assert(crypto_secretbox_NONCEBYTES == kNonceBytes);
static_assert(crypto_secretbox_MACBYTES == kMacBytes);

// Owns a copy of the secret on the heap and wipes it; moving DecryptionKey moves the pointer.
struct DecryptionKey::Secret {
  explicit Secret(const std::string& s) : bytes(s.begin(), s.end()) {}
  ~Secret() {
    if (!bytes.empty()) sodium_memzero(bytes.data(), bytes.size());
  }
  std::vector<uint8_t> bytes;
};

SecretKey::SecretKey(std::span<const uint8_t, kKeyBytes> bytes)
    : bytes_(std::make_unique<std::array<uint8_t, kKeyBytes>>()) {
  std::memcpy(bytes_->data(), bytes.data(), kKeyBytes);
}

SecretKey::~SecretKey() {
  if (bytes_ != nullptr) sodium_memzero(bytes_->data(), bytes_->size());
}

DecryptionKey::DecryptionKey(std::string& secret, bool passphrase)
    : secret_(std::make_unique<Secret>(secret)), passphrase_(passphrase) {
  // Wipe the factory's by-value argument too: it is a copy this object made.
  if (!secret.empty()) sodium_memzero(secret.data(), secret.size());
}

DecryptionKey DecryptionKey::FromRawKey(std::string bytes32) {
  return DecryptionKey(bytes32, false);
}

DecryptionKey DecryptionKey::FromPassphrase(std::string passphrase) {
  return DecryptionKey(passphrase, true);
}

DecryptionKey::~DecryptionKey() = default;
DecryptionKey::DecryptionKey(DecryptionKey&&) noexcept = default;
DecryptionKey& DecryptionKey::operator=(DecryptionKey&&) noexcept = default;

std::span<const uint8_t> DecryptionKey::secret() const {
  if (secret_ == nullptr) return {};
  return {secret_->bytes.data(), secret_->bytes.size()};
}

absl::Status EnsureSodium() {
  static const int result = sodium_init();
  if (result < 0) return absl::InternalError("libsodium failed to initialize");
  return absl::OkStatus();
}

absl::StatusOr<SecretKey> DeriveKey(std::span<const uint8_t> passphrase, const KeyDerivation& kd) {
  if (absl::Status status = EnsureSodium(); !status.ok()) return status;
  if (kd.alg != crypto_pwhash_ALG_ARGON2ID13 && kd.alg != crypto_pwhash_ALG_ARGON2I13) {
    return absl::InvalidArgumentError(absl::StrCat("unknown crypto_pwhash algorithm ", kd.alg));
  }
  if (kd.salt.size() != crypto_pwhash_SALTBYTES) {
    return absl::InvalidArgumentError(absl::StrCat("key derivation salt is ", kd.salt.size(),
                                                   " bytes, expected ", crypto_pwhash_SALTBYTES));
  }
  if (kd.opslimit < crypto_pwhash_OPSLIMIT_MIN || kd.opslimit > kMaxOpsLimit ||
      kd.memlimit < crypto_pwhash_MEMLIMIT_MIN || kd.memlimit > kMaxMemLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("key derivation opslimit ", kd.opslimit, " / memlimit ", kd.memlimit,
                     " outside the accepted range [", crypto_pwhash_OPSLIMIT_MIN, ", ",
                     kMaxOpsLimit, "] / [", crypto_pwhash_MEMLIMIT_MIN, ", ", kMaxMemLimit, "]"));
  }
  std::array<uint8_t, kKeyBytes> out{};
  const int rc =
      crypto_pwhash(out.data(), out.size(), reinterpret_cast<const char*>(passphrase.data()),
                    passphrase.size(), reinterpret_cast<const unsigned char*>(kd.salt.data()),
                    kd.opslimit, static_cast<size_t>(kd.memlimit), kd.alg);
  if (rc != 0) {
    sodium_memzero(out.data(), out.size());
    return absl::ResourceExhaustedError(absl::StrCat("crypto_pwhash failed (opslimit ", kd.opslimit,
                                                     ", memlimit ", kd.memlimit, ")"));
  }
  SecretKey key(out);
  sodium_memzero(out.data(), out.size());
  return key;
}

absl::StatusOr<const SecretKey*> KeyCache::Get(std::span<const uint8_t> passphrase,
                                               const KeyDerivation& kd) {
  std::lock_guard<std::mutex> lock(mu_);
  Params params{kd.salt, kd.opslimit, kd.memlimit, kd.alg};
  auto it = keys_.find(params);
  if (it != keys_.end()) return it->second.get();
  absl::StatusOr<SecretKey> key = DeriveKey(passphrase, kd);
  if (!key.ok()) return key.status();
  auto [inserted, unused] =
      keys_.emplace(std::move(params), std::make_unique<SecretKey>(*std::move(key)));
  return inserted->second.get();
}

Nonce ChunkNonce(const Nonce& initial, uint64_t index) {
  Nonce nonce = initial;
  Nonce addend{};
  for (size_t i = 0; i < sizeof(index); ++i) addend[i] = static_cast<uint8_t>(index >> (8 * i));
  sodium_add(nonce.data(), addend.data(), nonce.size());
  return nonce;
}

void IncrementNonce(Nonce& nonce) { sodium_increment(nonce.data(), nonce.size()); }

bool OpenDetached(std::byte* out, const std::byte* in, size_t size, const uint8_t mac[kMacBytes],
                  const Nonce& nonce, const SecretKey& key) {
  return crypto_secretbox_open_detached(reinterpret_cast<unsigned char*>(out),
                                        reinterpret_cast<const unsigned char*>(in), mac, size,
                                        nonce.data(), key.data()) == 0;
}

void SealDetached(std::byte* out, const std::byte* in, size_t size, uint8_t mac[kMacBytes],
                  const Nonce& nonce, const SecretKey& key) {
  crypto_secretbox_detached(reinterpret_cast<unsigned char*>(out), mac,
                            reinterpret_cast<const unsigned char*>(in), size, nonce.data(),
                            key.data());
}

}  // namespace kiln::tensorizer
