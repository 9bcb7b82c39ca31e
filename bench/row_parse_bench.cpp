// How fast JSONEachRow becomes columns (issue 22's "bulk inserts on simdjson"): rtable's own
// streaming parser (row_format.h), on one thread and on every core, beside simdjson 3.0's
// iterate_many (Debian's libsimdjson-dev) filling the same columns on one thread, for the same
// body as rtable-insert-bench's bulk insert (5 columns: UInt64, Date, String, Float64,
// Nullable(UInt32)). Only the parse: no sort, no part, no commit. Each reader runs --rounds times;
// the fastest round counts (the machine is shared).
// Usage: rtable-row-parse-bench [--rows N] [--rounds N]
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "bench_flags.h"
#include "rtable/replication_core/row_format.h"
#include "rtable/replication_core/table_schema.h"

namespace {

using namespace rtable::core;
using Clock = std::chrono::steady_clock;

std::string row(uint64_t id) {
  return fmt::format(R"({{"id":{},"d":"2026-{:02d}-{:02d}","user":"user-{}","value":{},"n":{}}})",
                     id, 10 + id % 3, 1 + id % 28, id % 1000, static_cast<double>(id) * 0.25,
                     id % 5 == 0 ? std::string("null") : std::to_string(id % 100000)) +
         "\n";
}

TableSchema schema() {
  auto type = [](const char* name) { return *DataType::parse(name); };
  return *TableSchema::create({{"id", type("UInt64")},
                               {"d", type("Date")},
                               {"user", type("String")},
                               {"value", type("Float64")},
                               {"n", type("Nullable(UInt32)")}},
                              *PartitionKey::parse("toYYYYMM(d)"), {"id"});
}

// Seconds of the fastest of `rounds` runs of `run`, which returns the rows it read.
template <class Run>
double fastest(int rounds, uint64_t rows, Run run) {
  double best = 1e9;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    const uint64_t read = run();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (read != rows) {
      fmt::print(stderr, "read {} rows, expected {}\n", read, rows);
      std::exit(1);
    }
    best = std::min(best, seconds);
  }
  return best;
}

std::size_t read_by_simdjson = 0;  // of the last one-thread run

uint64_t ownParser(const TableSchema& s, const std::string& body, std::size_t threads,
                   bool simdjson = true) {
  uint64_t rows = 0;
  auto sink = [&](Block&& block) { rows += block.rows(); };
  constexpr std::size_t kChunk = 256 * 1024;  // as the HTTP API feeds it
  auto check = [](const std::expected<void, ParseError>& done) {
    if (!done) fmt::print(stderr, "{}\n", done.error().toString()), std::exit(1);
  };
  if (threads == 1) {
    RowParser parser(s, RowFormat::kJSONEachRow, 65536, simdjson);
    for (std::size_t at = 0; at < body.size(); at += kChunk)
      check(parser.feed(std::string_view(body).substr(at, kChunk), sink));
    check(parser.finish(sink));
    read_by_simdjson = parser.rowsReadBySimdjson();
  } else {
    ParallelRowParser parser(s, RowFormat::kJSONEachRow, threads);
    for (std::size_t at = 0; at < body.size(); at += kChunk)
      check(parser.feed(std::string_view(body).substr(at, kChunk), sink));
    check(parser.finish(sink));
  }
  return rows;
}

// simdjson's on-demand reader over the newline-delimited documents, each field by name into its
// column (blocks of 65536 rows, as the own parser makes).
uint64_t simdjsonParser(const TableSchema& s, const simdjson::padded_string& body) {
  simdjson::ondemand::parser parser;
  simdjson::ondemand::document_stream docs;
  if (parser.iterate_many(body, 1 << 20).get(docs)) std::exit(1);
  uint64_t rows = 0;
  Block block = s.emptyBlock();
  std::vector<uint64_t>* ids;
  std::vector<uint16_t>* dates;
  std::vector<std::string>* users;
  std::vector<double>* values;
  std::vector<uint32_t>* ns;
  std::vector<uint8_t>* n_nulls;
  // A full block is handed on (dropped here) and a new one begun, as the own parser does.
  auto begin = [&] {
    block = s.emptyBlock();
    ids = &std::get<std::vector<uint64_t>>(block.columns[0].values);
    dates = &std::get<std::vector<uint16_t>>(block.columns[1].values);
    users = &std::get<std::vector<std::string>>(block.columns[2].values);
    values = &std::get<std::vector<double>>(block.columns[3].values);
    ns = &std::get<std::vector<uint32_t>>(block.columns[4].values);
    n_nulls = &block.columns[4].null_map;
  };
  begin();
  for (auto doc : docs) {
    simdjson::ondemand::object object;
    if (doc.get_object().get(object)) std::exit(1);
    for (auto field : object) {
      std::string_view key;
      if (field.unescaped_key().get(key)) std::exit(1);
      auto value = field.value();
      if (key == "id") {
        ids->push_back(value.get_uint64().value());
      } else if (key == "d") {
        dates->push_back(parseDate(value.get_string().value()).value());
      } else if (key == "user") {
        users->emplace_back(value.get_string().value());
      } else if (key == "value") {
        values->push_back(value.get_double().value());
      } else if (key == "n") {
        const bool null = value.is_null();
        n_nulls->push_back(null ? 1 : 0);
        ns->push_back(null ? 0 : static_cast<uint32_t>(value.get_uint64().value()));
      }
    }
    if (++rows % 65536 == 0) begin();
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t rows = 1'000'000;
  int rounds = 5;
  constexpr const char* kUsage = "usage: rtable-row-parse-bench [--rows N] [--rounds N]\n";
  auto refuse = [&](const std::string& why) {
    fmt::print(stderr, "rtable-row-parse-bench: {}\n{}", why, kUsage);
    return 2;
  };
  if (rtable::bench::wantsHelp(argc, argv)) return fmt::print("{}", kUsage), 0;
  if (auto paired = rtable::bench::pairedFlags(argc, argv); !paired) return refuse(paired.error());
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    auto number = [&](int64_t min, int64_t max) {
      return rtable::bench::wholeNumber(flag, argv[i + 1], min, max);
    };
    std::expected<int64_t, std::string> value;
    if (flag == "--rows") {
      if ((value = number(1, 1'000'000'000))) rows = static_cast<uint64_t>(*value);
    } else if (flag == "--rounds") {
      if ((value = number(1, 1000))) rounds = static_cast<int>(*value);
    } else {
      return refuse("unknown flag " + flag);
    }
    if (!value) return refuse(value.error());
  }
  const TableSchema s = schema();
  std::string body;
  for (uint64_t id = 0; id < rows; ++id) body += row(id);
  const simdjson::padded_string padded(body);
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  fmt::print("{} rows, {:.1f} MB of JSONEachRow, fastest of {} rounds\n\n", rows, body.size() / 1e6,
             rounds);
  fmt::print("{:<44} {:>12} {:>10}\n", "reader", "rows/s", "MB/s");
  auto report = [&](const std::string& name, double seconds) {
    fmt::print("{:<44} {:>12.0f} {:>10.0f}\n", name, rows / seconds, body.size() / 1e6 / seconds);
  };
  report("rtable RowParser, 1 thread",
         fastest(rounds, rows, [&] { return ownParser(s, body, 1); }));
  fmt::print("  of which read by simdjson: {} rows\n", read_by_simdjson);
  report("rtable RowParser, 1 thread, own scanner only",
         fastest(rounds, rows, [&] { return ownParser(s, body, 1, false); }));
  report(fmt::format("rtable ParallelRowParser, {} threads", cores),
         fastest(rounds, rows, [&] { return ownParser(s, body, cores); }));
  report("simdjson " SIMDJSON_STRINGIFY(SIMDJSON_VERSION) " iterate_many, 1 thread",
         fastest(rounds, rows, [&] { return simdjsonParser(s, padded); }));
  return 0;
}
