// rtable-core's table spec (YAML, from the operator's ConfigMap or a user's file): any bytes give
// a spec or an error, never a crash, a hang or a sanitizer report (table_spec.h).
#include <cstdint>
#include <string>

#include "rtable/replication_core/table_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  (void)rtable::core::TableSpec::parseYaml(text);
  return 0;
}
