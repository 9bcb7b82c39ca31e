// Rows from untrusted bytes: the insert API's bodies in JSONEachRow, TabSeparated and CSV, read
// into a table with a column of every type, plain and Nullable. Beyond "no crash, no sanitizer
// report": the answer (the rows, or the error with its row and column) must not depend on how
// the body is cut into chunks, nor, for JSONEachRow, on whether simdjson's pass reads it or the
// own scanner alone (row_format.h); and rows that parse, written back in each of the three formats
// by writeRows (as /select answers), must read back as the same rows. A difference aborts, and
// libFuzzer keeps the input.
//
// Input: byte 0 picks the format, byte 1 where the body is cut, the rest is the body.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/replication_core/row_format.h"

namespace {

using rtable::core::Block;
using rtable::core::ColumnSpec;
using rtable::core::DataType;
using rtable::core::RowFormat;
using rtable::core::RowParser;
using rtable::core::TableSchema;

const TableSchema& schema() {
  static const TableSchema kSchema = [] {
    std::vector<ColumnSpec> columns;
    for (const char* type : {"UInt8", "UInt16", "UInt32", "UInt64", "Int8", "Int16", "Int32",
                             "Int64", "Float32", "Float64", "String", "Date", "DateTime", "Bool"}) {
      columns.push_back({std::string("c_") + type, *DataType::parse(type)});
      columns.push_back(
          {std::string("n_") + type, *DataType::parse(std::string("Nullable(") + type + ")")});
    }
    return *TableSchema::create(std::move(columns), {}, {});
  }();
  return kSchema;
}

// The rows as printed in JSONEachRow (NaN compares equal so), or the error; with the blocks' sizes.
std::string answer(RowFormat format, std::string_view body, std::size_t cut, bool simdjson) {
  RowParser parser(schema(), format, /*max_block_rows=*/7, simdjson);
  std::string out;
  auto collect = [&](Block&& block) {
    out += "block of " + std::to_string(block.rows()) + "\n";
    rtable::core::writeRows(block, RowFormat::kJSONEachRow, out);
  };
  for (std::string_view chunk : {body.substr(0, cut), body.substr(cut)}) {
    if (auto fed = parser.feed(chunk, collect); !fed) return "error: " + fed.error().toString();
  }
  if (auto done = parser.finish(collect); !done) return "error: " + done.error().toString();
  return out;
}

// The rows of `body` in `format` as one JSONEachRow text, or nothing when it does not parse.
std::optional<std::string> rowsAsJson(RowFormat format, std::string_view body,
                                      std::vector<Block>* blocks = nullptr) {
  RowParser parser(schema(), format, /*max_block_rows=*/7, true);
  std::string out;
  auto collect = [&](Block&& block) {
    rtable::core::writeRows(block, RowFormat::kJSONEachRow, out);
    if (blocks) blocks->push_back(std::move(block));
  };
  if (!parser.feed(body, collect) || !parser.finish(collect)) return std::nullopt;
  return out;
}

// Rows that parse, written in each format by writeRows (what /select answers), parse back to the
// same rows.
void checkRoundTrip(RowFormat format, std::string_view body) {
  std::vector<Block> blocks;
  const auto rows = rowsAsJson(format, body, &blocks);
  if (!rows) return;
  for (RowFormat written_as :
       {RowFormat::kJSONEachRow, RowFormat::kTabSeparated, RowFormat::kCSV}) {
    std::string text;
    for (const Block& block : blocks) rtable::core::writeRows(block, written_as, text);
    const auto again = rowsAsJson(written_as, text);
    if (again != rows) {
      std::fprintf(stderr,
                   "rows written as %d do not read back (format %d):\nrows:\n%s\nwritten:\n%s\n"
                   "read back:\n%s\n",
                   static_cast<int>(written_as), static_cast<int>(format), rows->c_str(),
                   text.c_str(), again ? again->c_str() : "(an error)");
      std::abort();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 2) return 0;
  const RowFormat format = data[0] % 3 == 0   ? RowFormat::kJSONEachRow
                           : data[0] % 3 == 1 ? RowFormat::kTabSeparated
                                              : RowFormat::kCSV;
  const std::string_view body(reinterpret_cast<const char*>(data) + 2, size - 2);
  const std::size_t cut = body.empty() ? 0 : data[1] % (body.size() + 1);
  const std::string whole = answer(format, body, body.size(), true);
  const std::string in_two = answer(format, body, cut, true);
  const std::string scanner = answer(format, body, cut, false);
  if (whole != in_two || whole != scanner) {
    std::fprintf(stderr,
                 "rows differ (format %d, cut at %zu):\nwhole:\n%s\ncut in two:\n%s\nown scanner "
                 "only:\n%s\n",
                 static_cast<int>(format), cut, whole.c_str(), in_two.c_str(), scanner.c_str());
    std::abort();
  }
  checkRoundTrip(format, body);
  return 0;
}
