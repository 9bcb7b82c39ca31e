// 128-bit hashing (xxHash's XXH3-128) for part checksums, dedup ids and partition ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace rtable::core {

struct Hash128 {
  uint64_t high = 0;
  uint64_t low = 0;

  // 32 lowercase hex digits, high half first.
  std::string hex() const;
  // hex() read back; nullopt for anything but 32 lowercase hex digits.
  static std::optional<Hash128> fromHex(std::string_view text);
  friend bool operator==(const Hash128&, const Hash128&) = default;
};

// Streaming: update() any number of times, then digest(). Not thread-safe.
class Hasher128 {
 public:
  Hasher128();
  ~Hasher128();
  Hasher128(Hasher128&&) noexcept;
  Hasher128& operator=(Hasher128&&) noexcept;

  void update(const void* data, std::size_t size);
  void update(std::string_view bytes) { update(bytes.data(), bytes.size()); }
  // Fixed-width values in little-endian order, so the hash does not depend on the host.
  void updateU64(uint64_t value);
  // Length first, so ("ab","c") and ("a","bc") hash differently.
  void updateString(std::string_view bytes);
  Hash128 digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

Hash128 hash128(std::string_view bytes);

}  // namespace rtable::core
