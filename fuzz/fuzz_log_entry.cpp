// Replication log entries from untrusted bytes: anyone who could write a znode once could plant
// one, and every replica parses every entry. An entry that parses prints back to text that
// parses to the same entry, and prints the same again (log_entry.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "rtable/replication_core/log_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto entry = rtable::core::LogEntry::parse(text);
  if (!entry) return 0;
  const std::string printed = entry->format();
  auto again = rtable::core::LogEntry::parse(printed);
  if (!again || !(*again == *entry) || again->format() != printed) {
    std::fprintf(stderr, "log entry does not round-trip:\n%s\n---\n%s\n", printed.c_str(),
                 again ? again->format().c_str() : again.error().c_str());
    std::abort();
  }
  return 0;
}
