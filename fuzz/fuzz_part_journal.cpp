// The part journal's records on untrusted bytes: after a crash, restore() decodes whatever the
// journal files hold (a torn append, a damaged disk) and writes the parts out under the names
// they carry. Byte 0 even: the rest is a journal file as it stands (records, damage, zero fill);
// odd: the rest is one record's payload, wrapped with a correct header and hash, so that the
// payload decoder is reached (random bytes never match a record's XXH3). Checked: the names a
// decoded part would be written under are single path components, and the decoded parts encode
// to records that decode to the same parts with no damage.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "rtable/replication_core/hash128.h"
#include "rtable/replication_core/part_journal.h"

namespace {

bool plainComponent(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string bytes;
  if (data[0] % 2 == 0) {
    bytes = std::string(rest);
  } else {
    const uint32_t payload_size = static_cast<uint32_t>(rest.size());
    const rtable::core::Hash128 hash = rtable::core::hash128(rest);
    bytes = "RTJ1";
    bytes.append(reinterpret_cast<const char*>(&payload_size), sizeof(payload_size));
    bytes.append(reinterpret_cast<const char*>(&hash.high), sizeof(hash.high));
    bytes.append(reinterpret_cast<const char*>(&hash.low), sizeof(hash.low));
    bytes.append(rest);
  }
  const rtable::core::DecodedJournal decoded = rtable::core::decodeJournal(bytes);
  std::string again;
  for (const auto& part : decoded.parts) {
    bool plain = plainComponent(part.name);
    for (const auto& file : part.files) plain = plain && plainComponent(file.name);
    if (!plain) {
      std::fprintf(stderr, "a decoded part would be written outside its directory: '%s'\n",
                   part.name.c_str());
      std::abort();
    }
    again += part.encodeRecord();
  }
  const rtable::core::DecodedJournal redecoded = rtable::core::decodeJournal(again);
  if (!(redecoded.parts == decoded.parts) || !redecoded.damage.empty()) {
    std::fprintf(stderr, "journal records do not round-trip (%zu parts, then %zu; damage '%s')\n",
                 decoded.parts.size(), redecoded.parts.size(), redecoded.damage.c_str());
    std::abort();
  }
  return 0;
}
