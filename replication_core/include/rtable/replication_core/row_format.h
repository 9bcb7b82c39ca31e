// Row formats of the insert and select paths (DESIGN.md 2.3 step 1): JSONEachRow, TabSeparated
// and CSV, read by a streaming push parser into Blocks and written from Blocks, as ClickHouse
// reads and writes them. The accepted input is written down in docs/formats.md, "Row formats".
//
// RowParser is not thread-safe; one parser reads one stream. ParallelRowParser spreads one stream
// over worker threads. writeRows is a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "rtable/replication_core/block.h"
#include "rtable/replication_core/table_schema.h"

namespace rtable::core {

enum class RowFormat { kJSONEachRow, kTabSeparated, kCSV };

// "JSONEachRow" (also "JSONLines", "NDJSON"), "TabSeparated" or "TSV", "CSV": ClickHouse's names,
// case-sensitive as there. The error lists the accepted names.
std::expected<RowFormat, std::string> parseRowFormat(std::string_view name);
// The canonical name: "JSONEachRow", "TabSeparated", "CSV".
std::string_view rowFormatName(RowFormat format);

// Why the input was refused: the row (1-based, counted across the whole stream), the column when
// the error is about one, and what is wrong.
struct ParseError {
  std::size_t row = 0;
  std::string column;
  std::string message;

  // "row 3, column 'x': value '300' is out of range for UInt8", or "row 3: ..." without a column.
  std::string toString() const;
  friend bool operator==(const ParseError&, const ParseError&) = default;
};

// A push parser: feed it the body in chunks of any size, split anywhere, then call finish().
// Complete rows go into a block with the schema's columns in schema order; each time it holds
// max_block_rows rows it is handed to `on_block`, and finish() hands over the rest. Memory stays
// at one block plus the bytes of one unfinished row.
//
// The first error ends the stream: feed() and finish() then return it again. Blocks already handed
// out are not taken back, so a caller that must write all or nothing keeps them until finish()
// succeeds.
class RowParser {
 public:
  using BlockSink = std::function<void(Block&&)>;

  // Keeps a copy of the schema's columns; `schema` need not outlive the parser.
  // max_block_rows >= 1 (0 is taken as 1).
  // `simdjson`: JSONEachRow is read with simdjson where it takes the rows as they stand (the same
  // blocks and errors either way; false: the own scanner only, for tests that compare the two).
  RowParser(const TableSchema& schema, RowFormat format, std::size_t max_block_rows = 65536,
            bool simdjson = true);
  ~RowParser();
  RowParser(RowParser&&) noexcept;
  RowParser& operator=(RowParser&&) noexcept;

  std::expected<void, ParseError> feed(std::string_view chunk, const BlockSink& on_block);
  // Ends the stream: a last row without a line break is a row; an unfinished JSON object or CSV
  // quote is an error. Hands over the last block if it has rows.
  std::expected<void, ParseError> finish(const BlockSink& on_block);

  // Complete rows parsed so far; of them, the rows simdjson read.
  std::size_t rowsParsed() const;
  std::size_t rowsReadBySimdjson() const;

 private:
  friend class ParallelRowParser;
  struct State;
  std::unique_ptr<State> state_;
};

// RowParser's reading, with the rows parsed by `threads` worker threads: the stream is cut at row
// ends into segments of about `segment_bytes` (ClickHouse's parallel parsing), each parsed by its
// own RowParser. Blocks reach `on_block` in input order, in the calling thread, and an error is
// the one RowParser would give, with the same row number. A stream shorter than one segment is
// parsed in the calling thread. Not thread-safe itself, like RowParser.
class ParallelRowParser {
 public:
  using BlockSink = RowParser::BlockSink;

  ParallelRowParser(const TableSchema& schema, RowFormat format, std::size_t threads,
                    std::size_t max_block_rows = 65536, std::size_t segment_bytes = 1 << 20);
  ~ParallelRowParser();
  ParallelRowParser(const ParallelRowParser&) = delete;
  ParallelRowParser& operator=(const ParallelRowParser&) = delete;

  std::expected<void, ParseError> feed(std::string_view chunk, const BlockSink& on_block);
  std::expected<void, ParseError> finish(const BlockSink& on_block);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Appends rows [begin, min(end, block.rows())) of `block` to `out` in `format`, each row ending in
// '\n', values printed as ClickHouse prints them (see docs/formats.md, "Row formats").
void writeRows(const Block& block, RowFormat format, std::string& out, std::size_t begin = 0,
               std::size_t end = SIZE_MAX);

}  // namespace rtable::core
