#include "rtable/replication_core/hash128.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <charconv>

namespace rtable::core {

static_assert(std::endian::native == std::endian::little, "rtable stores little-endian values");

struct Hasher128::State {
  XXH3_state_t* xxh = XXH3_createState();
  State() { XXH3_128bits_reset(xxh); }
  ~State() { XXH3_freeState(xxh); }
};

std::string Hash128::hex() const {
  return fmt::format("{:016x}{:016x}", high, low);
}

std::optional<Hash128> Hash128::fromHex(std::string_view text) {
  if (text.size() != 32) return std::nullopt;
  for (char c : text) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return std::nullopt;
  }
  Hash128 hash;
  std::from_chars(text.data(), text.data() + 16, hash.high, 16);
  std::from_chars(text.data() + 16, text.data() + 32, hash.low, 16);
  return hash;
}

Hasher128::Hasher128() : state_(std::make_unique<State>()) {}
Hasher128::~Hasher128() = default;
Hasher128::Hasher128(Hasher128&&) noexcept = default;
Hasher128& Hasher128::operator=(Hasher128&&) noexcept = default;

void Hasher128::update(const void* data, std::size_t size) {
  XXH3_128bits_update(state_->xxh, data, size);
}

void Hasher128::updateU64(uint64_t value) {
  update(&value, sizeof(value));
}

void Hasher128::updateString(std::string_view bytes) {
  updateU64(bytes.size());
  update(bytes);
}

Hash128 Hasher128::digest() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_->xxh);
  return Hash128{h.high64, h.low64};
}

Hash128 hash128(std::string_view bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return Hash128{h.high64, h.low64};
}

}  // namespace rtable::core
