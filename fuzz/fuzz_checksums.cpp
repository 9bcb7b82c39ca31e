// A part's checksums.txt from untrusted bytes: a fetched part's list of files comes from its
// source replica, and a damaged disk can hold anything. Checksums that parse print back to the
// same text's meaning: parsing what format() writes gives the same checksums (part_format.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "rtable/replication_core/part_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto checksums = rtable::core::PartChecksums::parse(text);
  if (!checksums) return 0;
  const std::string printed = checksums->format();
  auto again = rtable::core::PartChecksums::parse(printed);
  if (!again || !(*again == *checksums) || again->format() != printed) {
    std::fprintf(stderr, "checksums do not round-trip:\n%s\n", printed.c_str());
    std::abort();
  }
  return 0;
}
