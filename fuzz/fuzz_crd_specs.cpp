// The operator's readers of its custom resources on untrusted JSON: anyone allowed to create a
// ReplicatedTable, ClusterBackup or BackupSchedule chooses every byte of its spec, and the
// apiserver's schema checks (CEL included) may be off or older than the operator. Byte 0 picks
// the reader: a ReplicatedTable spec, a ClusterBackup spec, a BackupSchedule spec, a cron
// schedule (the rest as its text), a ReplicatedTable status. Beyond "no crash, no sanitizer
// report": a spec that parses writes out (toJson) to JSON that parses to the same spec, and a
// ReplicatedTable spec that parses gives rtable-core's schema.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>

#include "rtable/controllers/backup_specs.h"
#include "rtable/controllers/replicated_table_spec.h"
#include "rtable/controllers/replicated_table_status.h"

namespace {

using namespace rtable::controllers;

template <class Spec, class... Args>
void checkRoundTrip(const char* kind, const nlohmann::json& input, Args... args) {
  auto parsed = Spec::parse(input, args...);
  if (!parsed) return;
  const nlohmann::json written = parsed->toJson();
  auto again = Spec::parse(written, args...);
  if (!again || !(*again == *parsed)) {
    std::fprintf(stderr, "%s: a parsed spec does not read back from its toJson():\n%s\n%s\n", kind,
                 written.dump().c_str(),
                 again ? "(a different spec)" : again.error().toString().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 5 == 3) {
    (void)CronSchedule::parse(rest);
    return 0;
  }
  const nlohmann::json input = nlohmann::json::parse(rest, nullptr, /*allow_exceptions=*/false);
  if (input.is_discarded()) return 0;
  switch (data[0] % 5) {
    case 0: {
      checkRoundTrip<ReplicatedTableSpec>("ReplicatedTable", input);
      if (auto spec = ReplicatedTableSpec::parse(input)) (void)spec->schema();
      break;
    }
    case 1:
      checkRoundTrip<ClusterBackupSpec>("ClusterBackup", input, std::string_view("spec"));
      break;
    case 2:
      checkRoundTrip<BackupScheduleSpec>("BackupSchedule", input);
      break;
    default:
      (void)ReplicatedTableStatus::parse(input);
      break;
  }
  return 0;
}
