#include "rtable/replication_core/hash128.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <charconv>
#include <cstring>

namespace rtable::core {

static_assert(std::endian::native == std::endian::little, "rtable stores little-endian values");

// Small updates (a string's length, then a short string: a dedup id hashes two per value) are
// gathered and handed to XXH3 in one call: its per-call cost outweighed the hashing. XXH3 streams
// bytes, so the digest is that of the same bytes in any split.
struct Hasher128::State {
  static constexpr std::size_t kGather = 4096;
  XXH3_state_t* xxh = XXH3_createState();
  std::size_t gathered = 0;
  alignas(64) unsigned char buffer[kGather];
  State() { XXH3_128bits_reset(xxh); }
  ~State() { XXH3_freeState(xxh); }
  void drain() {
    if (gathered > 0) XXH3_128bits_update(xxh, buffer, gathered);
    gathered = 0;
  }
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
  if (size == 0) return;  // an empty vector's data() may be null, which memcpy must not get
  State& state = *state_;
  if (state.gathered + size <= State::kGather) {
    std::memcpy(state.buffer + state.gathered, data, size);
    state.gathered += size;
    return;
  }
  state.drain();
  if (size < State::kGather) {
    std::memcpy(state.buffer, data, size);
    state.gathered = size;
  } else {
    XXH3_128bits_update(state.xxh, data, size);
  }
}

void Hasher128::updateU64(uint64_t value) {
  update(&value, sizeof(value));
}

void Hasher128::updateString(std::string_view bytes) {
  updateU64(bytes.size());
  update(bytes);
}

Hash128 Hasher128::digest() const {
  state_->drain();
  const XXH128_hash_t h = XXH3_128bits_digest(state_->xxh);
  return Hash128{h.high64, h.low64};
}

Hash128 hash128(std::string_view bytes) {
  const XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return Hash128{h.high64, h.low64};
}

}  // namespace rtable::core
