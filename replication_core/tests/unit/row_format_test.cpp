#include "rtable/replication_core/row_format.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

using namespace std::string_literals;

namespace rtable::core {
namespace {

TableSchema schemaOf(const std::vector<std::pair<std::string, std::string>>& columns) {
  std::vector<ColumnSpec> specs;
  for (const auto& [name, type] : columns) {
    auto parsed = DataType::parse(type);
    EXPECT_TRUE(parsed) << parsed.error();
    specs.push_back({name, *parsed});
  }
  auto schema = TableSchema::create(std::move(specs), {}, {});
  EXPECT_TRUE(schema) << schema.error();
  return *schema;
}

constexpr std::string_view kBom = "\xEF\xBB\xBF";

// How a test hands the input to the parser.
enum class Chunking { kWhole, kByteAtATime, kRandom };

struct Parsed {
  std::vector<Block> blocks;
  Block all;  // the blocks appended, or the schema's empty block
};

// `segment_bytes` > 0: a ParallelRowParser with two workers and segments of about that size.
template <class Parser = RowParser>
std::expected<Parsed, ParseError> parseWith(Parser parser, const TableSchema& schema,
                                            std::string_view input, Chunking chunking,
                                            uint32_t seed);

std::expected<Parsed, ParseError> parse(const TableSchema& schema, RowFormat format,
                                        std::string_view input,
                                        Chunking chunking = Chunking::kWhole,
                                        std::size_t max_block_rows = 65536, uint32_t seed = 1,
                                        std::size_t segment_bytes = 0) {
  if (segment_bytes > 0) {
    return parseWith(
        std::make_unique<ParallelRowParser>(schema, format, 2, max_block_rows, segment_bytes),
        schema, input, chunking, seed);
  }
  return parseWith(std::make_unique<RowParser>(schema, format, max_block_rows), schema, input,
                   chunking, seed);
}

template <class Parser>
std::expected<Parsed, ParseError> parseWith(Parser owned, const TableSchema& schema,
                                            std::string_view input, Chunking chunking,
                                            uint32_t seed) {
  auto& parser = *owned;
  Parsed parsed;
  auto collect = [&](Block&& block) { parsed.blocks.push_back(std::move(block)); };
  std::mt19937 random(seed);
  std::size_t pos = 0;
  while (pos < input.size()) {
    std::size_t size = input.size();
    if (chunking == Chunking::kByteAtATime) size = 1;
    if (chunking == Chunking::kRandom)
      size = std::uniform_int_distribution<std::size_t>(0, 40)(random);
    auto fed = parser.feed(input.substr(pos, size), collect);
    if (!fed) return std::unexpected(fed.error());
    pos += std::min(size, input.size() - pos);
  }
  if (auto finished = parser.finish(collect); !finished) return std::unexpected(finished.error());
  parsed.all = schema.emptyBlock();
  for (const auto& block : parsed.blocks) parsed.all.append(block);
  return parsed;
}

// `text` with `edits` random edits: a byte replaced by one of the formats' special characters,
// deleted, or the text cut off there.
std::string damage(std::string text, int edits, std::mt19937& random) {
  const char kSpecial[] = {'"', '\\', '\t', '\n', '\r', ',', '{', '}', ':', 'u', 'N', '\xEF', '\0'};
  for (int edit = 0; edit < edits && !text.empty(); ++edit) {
    const std::size_t at = random() % text.size();
    switch (random() % 4) {
      case 0:
        text.erase(at, 1);
        break;
      case 1:
        text.resize(at);
        break;
      default:
        text[at] = kSpecial[random() % sizeof(kSpecial)];
    }
  }
  return text;
}

Block parseOk(const TableSchema& schema, RowFormat format, std::string_view input) {
  auto parsed = parse(schema, format, input);
  EXPECT_TRUE(parsed) << parsed.error().toString() << "\ninput:\n" << input;
  return parsed ? parsed->all : schema.emptyBlock();
}

ParseError parseError(const TableSchema& schema, RowFormat format, std::string_view input) {
  auto parsed = parse(schema, format, input);
  EXPECT_FALSE(parsed) << "input was accepted:\n" << input;
  return parsed ? ParseError{} : parsed.error();
}

// Block equality where NaN equals NaN (Block's operator== follows IEEE: NaN != NaN).
::testing::AssertionResult sameRows(const Block& a, const Block& b) {
  if (a.columns.size() != b.columns.size())
    return ::testing::AssertionFailure() << "column counts differ";
  for (std::size_t i = 0; i < a.columns.size(); ++i) {
    const Column& x = a.columns[i];
    const Column& y = b.columns[i];
    if (x.name != y.name || x.type != y.type || x.null_map != y.null_map || x.size() != y.size()) {
      return ::testing::AssertionFailure()
             << "column '" << x.name << "' differs in name, type, size or nulls";
    }
    const bool equal = std::visit(
        [&](const auto& xs) {
          const auto& ys = std::get<std::decay_t<decltype(xs)>>(y.values);
          for (std::size_t row = 0; row < xs.size(); ++row) {
            if constexpr (std::is_floating_point_v<
                              typename std::decay_t<decltype(xs)>::value_type>) {
              if (std::isnan(xs[row]) && std::isnan(ys[row])) continue;
            }
            if (!(xs[row] == ys[row])) return false;
          }
          return true;
        },
        x.values);
    if (!equal) {
      std::string text;
      writeRows(a, RowFormat::kTabSeparated, text);
      text += "vs\n";
      writeRows(b, RowFormat::kTabSeparated, text);
      return ::testing::AssertionFailure() << "column '" << x.name << "' differs:\n" << text;
    }
  }
  return ::testing::AssertionSuccess();
}

template <class T>
std::vector<T>& values(Block& block, std::size_t column) {
  return std::get<std::vector<T>>(block.columns[column].values);
}

template <class T>
const std::vector<T>& values(const Block& block, std::size_t column) {
  return std::get<std::vector<T>>(block.columns[column].values);
}

constexpr RowFormat kFormats[] = {RowFormat::kJSONEachRow, RowFormat::kTabSeparated,
                                  RowFormat::kCSV};

// The same rows, or the same error (row, column, message).
::testing::AssertionResult sameAnswer(const std::expected<Parsed, ParseError>& a,
                                      const std::expected<Parsed, ParseError>& b) {
  if (a.has_value() != b.has_value()) {
    return ::testing::AssertionFailure()
           << (a ? "rows" : a.error().toString()) << " vs " << (b ? "rows" : b.error().toString());
  }
  if (a) return sameRows(a->all, b->all);
  if (a.error() == b.error()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << a.error().toString() << " vs " << b.error().toString();
}

TEST(RowFormatNames, ParseLikeClickHouse) {
  EXPECT_EQ(parseRowFormat("JSONEachRow"), RowFormat::kJSONEachRow);
  EXPECT_EQ(parseRowFormat("NDJSON"), RowFormat::kJSONEachRow);
  EXPECT_EQ(parseRowFormat("TSV"), RowFormat::kTabSeparated);
  EXPECT_EQ(parseRowFormat("TabSeparated"), RowFormat::kTabSeparated);
  EXPECT_EQ(parseRowFormat("CSV"), RowFormat::kCSV);
  auto bad = parseRowFormat("Parquet");
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error(),
            "unknown format 'Parquet' (accepted: JSONEachRow, JSONLines, NDJSON, TabSeparated, "
            "TSV, CSV)");
  for (RowFormat format : kFormats) EXPECT_EQ(parseRowFormat(rowFormatName(format)), format);
  EXPECT_EQ((ParseError{3, "x", "value '300' is out of range for UInt8"}).toString(),
            "row 3, column 'x': value '300' is out of range for UInt8");
  EXPECT_EQ((ParseError{2, "", "too many fields"}).toString(), "row 2: too many fields");
}

// Every type, plain and Nullable, with the extremes of each: what writeRows prints, RowParser
// reads back to the same block, in every format.
class RowFormatEveryType : public ::testing::Test {
 protected:
  static constexpr const char* kTypes[] = {"UInt8",  "UInt16", "UInt32",   "UInt64",  "Int8",
                                           "Int16",  "Int32",  "Int64",    "Float32", "Float64",
                                           "String", "Date",   "DateTime", "Bool"};

  static TableSchema schema() {
    std::vector<std::pair<std::string, std::string>> columns;
    for (const char* type : kTypes) {
      columns.emplace_back(std::string("c_") + type, type);
      columns.emplace_back(std::string("n_") + type, std::string("Nullable(") + type + ")");
    }
    return schemaOf(columns);
  }

  static const std::vector<std::string>& strings() {
    static const std::vector<std::string> kStrings = {
        "",
        "tab\there, newline\nhere, cr\r, nul \0, bell \a, bs \b ff \f"s,
        "\"double\" 'single' back\\slash \\N \\t , ; {} [] } / \\u0041",
        "ünïcödé € 😀 \xE2\x80\xA8 line separator",
        "\\N",
        "  padded  ",
        "\n",
        "x,y",
    };
    return kStrings;
  }

  static Block rows() {
    Block block = schema().emptyBlock();
    const std::size_t n = strings().size();
    auto fill = [&]<class T>(std::size_t column, std::vector<T> plain) {
      const T last = plain.back();
      plain.resize(n, last);
      values<T>(block, column) = plain;
      values<T>(block, column + 1) = plain;
      // Nullable: NULL in every other row, the default value under it.
      auto& nullable = values<T>(block, column + 1);
      auto& nulls = block.columns[column + 1].null_map;
      nulls.assign(n, 0);
      for (std::size_t row = 0; row < n; row += 2) {
        nulls[row] = 1;
        nullable[row] = T{};
      }
    };
    auto limits = []<class T>(std::type_identity<T>) {
      return std::vector<T>{std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), T{0},
                            T{1}, T{42}};
    };
    fill(0, limits(std::type_identity<uint8_t>{}));
    fill(2, limits(std::type_identity<uint16_t>{}));
    fill(4, limits(std::type_identity<uint32_t>{}));
    fill(6, limits(std::type_identity<uint64_t>{}));
    fill(8, limits(std::type_identity<int8_t>{}));
    fill(10, limits(std::type_identity<int16_t>{}));
    fill(12, limits(std::type_identity<int32_t>{}));
    fill(14, limits(std::type_identity<int64_t>{}));
    fill(16, std::vector<float>{
                 std::numeric_limits<float>::lowest(), std::numeric_limits<float>::max(),
                 std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                 -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(),
                 0.1f});
    fill(18, std::vector<double>{
                 std::numeric_limits<double>::lowest(), std::numeric_limits<double>::max(),
                 std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                 -std::numeric_limits<double>::infinity(),
                 std::numeric_limits<double>::denorm_min(), -0.1, 1e21});
    fill(20, strings());
    fill(22, std::vector<uint16_t>{0, 65535, 20788});
    fill(24, std::vector<uint32_t>{0, UINT32_MAX, 1764558000});
    fill(26, std::vector<uint8_t>{0, 1});
    return block;
  }
};

TEST_F(RowFormatEveryType, RoundTripsThroughEachFormat) {
  const Block original = rows();
  for (RowFormat format : kFormats) {
    SCOPED_TRACE(rowFormatName(format));
    std::string text;
    writeRows(original, format, text);
    EXPECT_TRUE(sameRows(parseOk(schema(), format, text), original)) << text;
  }
}

TEST_F(RowFormatEveryType, EachFormatGivesTheSameBlockChunkedAnyWay) {
  Block many = schema().emptyBlock();
  for (int i = 0; i < 20; ++i) many.append(rows());
  for (RowFormat format : kFormats) {
    SCOPED_TRACE(rowFormatName(format));
    std::string text;
    writeRows(many, format, text);
    for (Chunking chunking : {Chunking::kWhole, Chunking::kByteAtATime, Chunking::kRandom}) {
      for (uint32_t seed : {1u, 2u, 3u}) {
        auto parsed = parse(schema(), format, text, chunking, 65536, seed);
        ASSERT_TRUE(parsed) << parsed.error().toString();
        EXPECT_TRUE(sameRows(parsed->all, many));
        if (chunking != Chunking::kRandom) break;
      }
    }
  }
}

// Damaged input (bytes replaced by the formats' special characters, deleted, or cut off) gets the
// same answer however it is chunked: the same rows or the same error.
TEST_F(RowFormatEveryType, DamagedInputGetsTheSameAnswerHoweverChunked) {
  std::mt19937 random(42);
  std::size_t errors = 0;
  for (RowFormat format : kFormats) {
    SCOPED_TRACE(rowFormatName(format));
    std::string text;
    writeRows(rows(), format, text);
    for (uint32_t trial = 0; trial < 200; ++trial) {
      const std::string damaged = damage(text, 3, random);
      auto whole = parse(schema(), format, damaged, Chunking::kWhole);
      for (Chunking chunking : {Chunking::kByteAtATime, Chunking::kRandom}) {
        EXPECT_TRUE(sameAnswer(parse(schema(), format, damaged, chunking, 3, trial), whole))
            << damaged;
      }
      errors += whole ? 0 : 1;
    }
  }
  EXPECT_GT(errors, 300u);  // most damage is caught
}

// ParallelRowParser cuts the stream where RowParser starts rows and parses the pieces in worker
// threads: the same rows, in the same order, however the stream is chunked and cut.
TEST_F(RowFormatEveryType, TheParallelParserGivesTheSameRows) {
  Block many = schema().emptyBlock();
  for (int i = 0; i < 20; ++i) many.append(rows());
  for (RowFormat format : kFormats) {
    SCOPED_TRACE(rowFormatName(format));
    std::string text = std::string(kBom);
    writeRows(many, format, text);
    for (std::size_t segment :
         {std::size_t{1}, std::size_t{100}, std::size_t{4096}, std::size_t{1} << 20}) {
      for (Chunking chunking : {Chunking::kWhole, Chunking::kByteAtATime, Chunking::kRandom}) {
        auto parsed = parse(schema(), format, text, chunking, 7, 5, segment);
        ASSERT_TRUE(parsed) << parsed.error().toString() << " segment " << segment;
        EXPECT_TRUE(sameRows(parsed->all, many)) << "segment " << segment;
      }
    }
  }
}

// Damaged input through the parallel parser: the same rows, or the same error with the same row
// number, as the plain parser reading it whole.
TEST_F(RowFormatEveryType, TheParallelParserGivesTheSameAnswerForDamagedInput) {
  std::mt19937 random(7);
  std::size_t errors = 0;
  for (RowFormat format : kFormats) {
    SCOPED_TRACE(rowFormatName(format));
    std::string text;
    for (int i = 0; i < 4; ++i) writeRows(rows(), format, text);
    for (uint32_t trial = 0; trial < 150; ++trial) {
      const std::string damaged =
          damage(trial % 10 == 0 ? std::string(kBom) + text : text, 2, random);
      auto whole = parse(schema(), format, damaged, Chunking::kWhole);
      auto parallel =
          parse(schema(), format, damaged, Chunking::kRandom, 3, trial, 1 + trial % 200);
      EXPECT_TRUE(sameAnswer(parallel, whole)) << damaged;
      errors += whole ? 0 : 1;
    }
  }
  EXPECT_GT(errors, 200u);
}

// The parallel parser cuts JSONEachRow at line breaks; a row written over several lines can be
// cut in its middle, and must still come out as RowParser reads it (whole rows, or the same error
// with the same row number), damaged or not, however it is chunked and cut.
TEST_F(RowFormatEveryType, TheParallelParserReadsJsonRowsSpreadOverLines) {
  std::string one_line;
  for (int i = 0; i < 6; ++i) writeRows(rows(), RowFormat::kJSONEachRow, one_line);
  // Every other row over several lines: a line break after '{' and each ',' outside strings.
  std::string spread;
  bool in_string = false, escaped = false, spreading = false;
  for (char c : one_line) {
    spread += c;
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '\n') {
      spreading = !spreading;
    } else if (spreading && (c == '{' || c == ',')) {
      spread += "\n  ";
    }
  }
  ASSERT_GT(std::count(spread.begin(), spread.end(), '\n'),
            2 * std::count(one_line.begin(), one_line.end(), '\n'));
  auto expected = parse(schema(), RowFormat::kJSONEachRow, one_line);
  ASSERT_TRUE(expected) << expected.error().toString();
  std::mt19937 random(11);
  for (uint32_t trial = 0; trial < 120; ++trial) {
    const std::string input = trial < 20 ? spread : damage(spread, 2, random);
    auto whole = parse(schema(), RowFormat::kJSONEachRow, input, Chunking::kWhole);
    if (trial < 20) {
      ASSERT_TRUE(whole) << whole.error().toString();
      EXPECT_TRUE(sameRows(whole->all, expected->all));
    }
    auto parallel =
        parse(schema(), RowFormat::kJSONEachRow, input,
              trial % 2 ? Chunking::kRandom : Chunking::kWhole, 3, trial, 1 + (trial * 97) % 3000);
    EXPECT_TRUE(sameAnswer(parallel, whole)) << "trial " << trial;
  }
}

// JSONEachRow through simdjson (where it takes the rows) and through the own scanner alone give
// the same answer: the same rows, or the same error with the same row and column, for the rows
// of every type as written and damaged, fed whole and in chunks that cut rows anywhere.
TEST_F(RowFormatEveryType, SimdjsonAndTheScannerGiveTheSameAnswer) {
  std::string text;
  for (int i = 0; i < 6; ++i) writeRows(rows(), RowFormat::kJSONEachRow, text);
  ASSERT_GT(text.size(), 8192u);
  auto read = [&](std::string_view input, bool simdjson, std::size_t chunk,
                  std::size_t* by_simdjson) -> std::expected<Parsed, ParseError> {
    RowParser parser(schema(), RowFormat::kJSONEachRow, 50, simdjson);
    Parsed parsed;
    auto collect = [&](Block&& block) { parsed.blocks.push_back(std::move(block)); };
    for (std::size_t at = 0; at < input.size(); at += chunk) {
      if (auto fed = parser.feed(input.substr(at, chunk), collect); !fed)
        return std::unexpected(fed.error());
    }
    if (auto done = parser.finish(collect); !done) return std::unexpected(done.error());
    if (by_simdjson) *by_simdjson = parser.rowsReadBySimdjson();
    parsed.all = schema().emptyBlock();
    for (const auto& block : parsed.blocks) parsed.all.append(block);
    return parsed;
  };
  std::size_t by_simdjson = 0;
  auto fast = read(text, true, text.size(), &by_simdjson);
  ASSERT_TRUE(fast) << fast.error().toString();
  EXPECT_EQ(by_simdjson, fast->all.rows()) << "simdjson did not read the rows";
  EXPECT_TRUE(sameAnswer(fast, read(text, false, text.size(), nullptr)));
  std::mt19937 random(2026);
  std::size_t errors = 0;
  std::size_t fast_rows = 0;
  for (uint32_t trial = 0; trial < 2000; ++trial) {
    const std::string damaged = damage(text, 1 + trial % 3, random);
    const std::size_t chunk = trial % 2 ? damaged.size() + 1 : 4096 + trial * 37;
    std::size_t rows_fast = 0;
    auto with = read(damaged, true, chunk, &rows_fast);
    auto without = read(damaged, false, damaged.size() + 1, nullptr);
    EXPECT_TRUE(sameAnswer(with, without)) << "trial " << trial << ":\n" << damaged;
    errors += without ? 0 : 1;
    fast_rows += rows_fast;
  }
  EXPECT_GT(errors, 1000u);  // most damage is caught, by the scanner's own errors
  EXPECT_GT(fast_rows, 0u);  // and simdjson still read the undamaged chunks
}

// Hand-written rows simdjson must take or leave exactly as the scanner does: keys in any order,
// blanks, escapes, numbers in strings, booleans into numbers, a missing Nullable column, and the
// ones the scanner refuses (an unknown key, a repeated key, an object value, a number out of
// range, a missing column that is not Nullable, ...).
TEST(RowFormatSimdjson, TakesOrLeavesEachRowAsTheScannerDoes) {
  const TableSchema schema = schemaOf({{"id", "UInt64"},
                                       {"small", "UInt8"},
                                       {"s", "String"},
                                       {"n", "Nullable(Int32)"},
                                       {"f", "Float64"},
                                       {"d", "Date"},
                                       {"t", "DateTime"},
                                       {"b", "Bool"}});
  const std::vector<std::string> good = {
      R"({"id":1,"small":2,"s":"a","n":3,"f":1.5,"d":"2026-12-01","t":"2026-12-01 10:00:00","b":true})",
      R"({ "b" : false , "t" : 1764583200, "d":"2026-12-02", "f":-0.25e3, "n":null, "s":"\"q\" \\ \u00e9 \ud83d\ude00", "small":"7", "id":"18446744073709551615" })",
      R"({"id":3,"small":true,"s":"x","f":"nan","d":"2026-12-03","t":"2026-12-03 00:00:00","b":1})",
      R"({"id":4,"small":0,"s":12.5,"n":-2147483648,"f":1e308,"d":"2026-12-04","t":0,"b":"true"})",
  };
  const std::vector<std::string> bad = {
      R"({"id":5,"small":1,"s":"a","f":1,"d":"2026-12-01","t":0,"b":true,"zzz":1})",
      R"({"id":5,"id":6,"small":1,"s":"a","f":1,"d":"2026-12-01","t":0,"b":true})",
      R"({"id":5,"small":1,"s":{"x":1},"f":1,"d":"2026-12-01","t":0,"b":true})",
      R"({"id":5,"small":300,"s":"a","f":1,"d":"2026-12-01","t":0,"b":true})",
      R"({"id":5,"small":1,"s":"a","d":"2026-12-01","t":0,"b":true})",
      R"({"id":5,"small":1,"s":"a","f":1,"d":20261201,"t":0,"b":true})",
      R"({"id":-5,"small":1,"s":"a","f":1,"d":"2026-12-01","t":0,"b":true})",
      R"({"id":5,"small":1,"s":"a","f":1,"d":"2026-12-01","t":0,"b":nul})",
      R"({"id":5,"small":1,"s":"a","f":1,"d":"2026-12-01","t":0,"b":true},)",
  };
  auto read = [&](const std::string& input, bool simdjson,
                  std::size_t* by_simdjson) -> std::expected<Parsed, ParseError> {
    RowParser parser(schema, RowFormat::kJSONEachRow, 65536, simdjson);
    Parsed parsed;
    auto collect = [&](Block&& block) { parsed.blocks.push_back(std::move(block)); };
    auto fed = parser.feed(input, collect);
    if (fed) fed = parser.finish(collect);
    if (!fed) return std::unexpected(fed.error());
    if (by_simdjson) *by_simdjson = parser.rowsReadBySimdjson();
    parsed.all = schema.emptyBlock();
    for (const auto& block : parsed.blocks) parsed.all.append(block);
    return parsed;
  };
  // Enough rows for simdjson to be tried (4 KiB), each good row many times.
  std::string many;
  for (int i = 0; i < 40; ++i) many += good[i % good.size()] + "\n";
  std::size_t by_simdjson = 0;
  auto fast = read(many, true, &by_simdjson);
  ASSERT_TRUE(fast) << fast.error().toString();
  EXPECT_EQ(by_simdjson, 40u);
  EXPECT_TRUE(sameAnswer(fast, read(many, false, nullptr)));
  for (const auto& row : bad) {
    SCOPED_TRACE(row);
    const std::string input = many + row + "\n" + many;
    auto with = read(input, true, nullptr);
    EXPECT_FALSE(with);
    EXPECT_TRUE(sameAnswer(with, read(input, false, nullptr)));
  }
}

TEST_F(RowFormatEveryType, WritesOnlyTheRequestedRows) {
  const Block original = rows();
  std::string all;
  std::string parts;
  writeRows(original, RowFormat::kCSV, all);
  writeRows(original, RowFormat::kCSV, parts, 0, 3);
  writeRows(original, RowFormat::kCSV, parts, 3);
  EXPECT_EQ(parts, all);
  std::string none;
  writeRows(original, RowFormat::kCSV, none, 5, 5);
  writeRows(original, RowFormat::kCSV, none, 100);
  EXPECT_EQ(none, "");
}

TEST(RowParserBlocks, SplitAtMaxBlockRowsWithRowNumbersAcrossBlocks) {
  const auto schema = schemaOf({{"i", "UInt32"}, {"s", "String"}});
  std::string text;
  for (int i = 0; i < 10; ++i) text += std::to_string(i) + "\t\"quoted, \\t\"\n";
  for (Chunking chunking : {Chunking::kWhole, Chunking::kByteAtATime, Chunking::kRandom}) {
    auto parsed = parse(schema, RowFormat::kTabSeparated, text, chunking, 3);
    ASSERT_TRUE(parsed) << parsed.error().toString();
    ASSERT_EQ(parsed->blocks.size(), 4u);
    for (std::size_t b = 0; b < 4; ++b) EXPECT_EQ(parsed->blocks[b].rows(), b < 3 ? 3u : 1u);
    EXPECT_EQ(values<uint32_t>(parsed->blocks[3], 0), std::vector<uint32_t>{9});
    EXPECT_EQ(values<std::string>(parsed->blocks[0], 1)[0], "\"quoted, \t\"");
  }
  // The error in row 8 counts the rows of the blocks already handed out.
  text += "oops\tx\n";
  auto bad = parse(schema, RowFormat::kTabSeparated, text, Chunking::kRandom, 3);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().toString(), "row 11, column 'i': value 'oops' is not a valid UInt32");
  // Exactly a multiple of the block size: no empty block at the end.
  auto even = parse(schema, RowFormat::kTabSeparated, "1\ta\n2\tb\n3\tc\n", Chunking::kWhole, 3);
  ASSERT_TRUE(even);
  EXPECT_EQ(even->blocks.size(), 1u);
  auto empty = parse(schema, RowFormat::kTabSeparated, "");
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->blocks.empty());
}

TEST(RowParserStream, SkipsAByteOrderMarkAndEndsAtFinish) {
  const auto schema = schemaOf({{"s", "String"}});
  for (Chunking chunking : {Chunking::kWhole, Chunking::kByteAtATime}) {
    auto with_bom = parse(schema, RowFormat::kTabSeparated,
                          "\xEF\xBB\xBF"
                          "a\nb",
                          chunking);
    ASSERT_TRUE(with_bom);
    EXPECT_EQ(values<std::string>(with_bom->all, 0), (std::vector<std::string>{"a", "b"}));
    // Bytes that only start like a byte order mark are data.
    auto not_bom = parse(schema, RowFormat::kTabSeparated, "\xEF\xBBx\n\xEF", chunking);
    ASSERT_TRUE(not_bom);
    EXPECT_EQ(values<std::string>(not_bom->all, 0),
              (std::vector<std::string>{"\xEF\xBBx", "\xEF"}));
  }
  RowParser parser(schema, RowFormat::kCSV);
  auto ignore = [](Block&&) {};
  ASSERT_TRUE(parser.feed("a", ignore));
  ASSERT_TRUE(parser.finish(ignore));
  EXPECT_EQ(parser.rowsParsed(), 1u);
  EXPECT_TRUE(parser.finish(ignore));
  EXPECT_EQ(parser.feed("b\n", ignore).error().toString(),
            "row 2: data after the end of the stream");
}

TEST(RowParserFormats, TheSameRowsInEachFormatGiveEqualBlocks) {
  const auto schema = schemaOf({{"id", "UInt64"},
                                {"name", "String"},
                                {"score", "Nullable(Float64)"},
                                {"day", "Date"},
                                {"at", "DateTime"},
                                {"ok", "Bool"},
                                {"delta", "Int16"}});
  const std::string json =
      "{\"id\":1,\"name\":\"a\\tb\",\"score\":1.5,\"day\":\"2026-12-01\",\"at\":\"2026-12-01 "
      "03:00:00\","
      "\"ok\":true,\"delta\":-5}\n"
      "\n"
      "  {\"delta\":\"7\", \"ok\":0, \"at\":1764558000, \"day\":\"1970-01-01\", "
      "\"name\":\"\\\"q\\\"\\n\","
      " \"id\":\"18446744073709551615\"}\r\n"
      "{\"id\":3,\"name\":\"\\u00e9\\ud83d\\ude00\",\"score\":\"-inf\",\"day\":\"2149-06-06\","
      "\"at\":\"1970-01-01 00:00:00\",\"ok\":1,\"delta\":32767}";
  const std::string tsv =
      "1\ta\\tb\t1.5\t2026-12-01\t2026-12-01 03:00:00\ttrue\t-5\n"
      "18446744073709551615\t\"q\"\\n\t\\N\t1970-01-01\t1764558000\t0\t+7\r\n"
      "3\t\xC3\xA9\xF0\x9F\x98\x80\t-inf\t2149-06-06\t1970-01-01 00:00:00\t1\t32767";
  const std::string csv =
      "1,\"a\tb\",1.5,2026-12-01,\"2026-12-01 03:00:00\",true,-5\n"
      "18446744073709551615, \"\"\"q\"\"\n\" ,,\"1970-01-01\",1764558000,false,\"7\"\r\n"
      "3,\xC3\xA9\xF0\x9F\x98\x80,-inf,2149-06-06,1970-01-01 00:00:00,1,32767";
  const Block from_json = parseOk(schema, RowFormat::kJSONEachRow, json);
  ASSERT_EQ(from_json.rows(), 3u);
  EXPECT_EQ(values<uint64_t>(from_json, 0), (std::vector<uint64_t>{1, UINT64_MAX, 3}));
  EXPECT_EQ(values<std::string>(from_json, 1),
            (std::vector<std::string>{"a\tb", "\"q\"\n", "\xC3\xA9\xF0\x9F\x98\x80"}));
  EXPECT_EQ(from_json.columns[2].null_map, (std::vector<uint8_t>{0, 1, 0}));
  EXPECT_EQ(values<double>(from_json, 2)[2], -std::numeric_limits<double>::infinity());
  EXPECT_EQ(values<uint16_t>(from_json, 3), (std::vector<uint16_t>{20788, 0, 65535}));
  EXPECT_EQ(values<uint32_t>(from_json, 4),
            (std::vector<uint32_t>{1764558000 + 365 * 86400, 1764558000, 0}));
  EXPECT_EQ(values<uint8_t>(from_json, 5), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(values<int16_t>(from_json, 6), (std::vector<int16_t>{-5, 7, 32767}));
  EXPECT_TRUE(sameRows(parseOk(schema, RowFormat::kTabSeparated, tsv), from_json));
  EXPECT_TRUE(sameRows(parseOk(schema, RowFormat::kCSV, csv), from_json));
}

TEST(RowParserJson, AcceptsWhatClickHouseAccepts) {
  const auto schema = schemaOf(
      {{"i", "Int32"}, {"f", "Float32"}, {"s", "String"}, {"n", "Nullable(UInt8)"}, {"b", "Bool"}});
  const Block block = parseOk(
      schema, RowFormat::kJSONEachRow,
      "\xEF\xBB\xBF{\"i\":true,\"f\":\"nan\",\"s\":12.50,\"b\":false}"
      "{ \"s\" : true , \"i\" : -2147483648 , \"f\" : 1e-50, \"b\" : \"1\" , \"n\" : \"255\" }"
      "{\"i\":\"+7\",\"f\":-0.0,\"s\":\"\\/\\b\\f\\r\\u0000\",\"b\":1,\"n\":null}\n\n");
  ASSERT_EQ(block.rows(), 3u);
  EXPECT_EQ(values<int32_t>(block, 0), (std::vector<int32_t>{1, INT32_MIN, 7}));
  EXPECT_TRUE(std::isnan(values<float>(block, 1)[0]));
  EXPECT_EQ(values<float>(block, 1)[1], 0.0f);  // underflow is zero, as strtod gives it
  EXPECT_EQ(values<std::string>(block, 2),
            (std::vector<std::string>{"12.50", "true", "/\b\f\r\0"s}));
  EXPECT_EQ(block.columns[3].null_map, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(values<uint8_t>(block, 3)[1], 255);
  EXPECT_EQ(values<uint8_t>(block, 4), (std::vector<uint8_t>{0, 1, 1}));
  // An object with no keys is a row of NULLs when every column is Nullable.
  const auto nullable = schemaOf({{"a", "Nullable(String)"}});
  EXPECT_EQ(parseOk(nullable, RowFormat::kJSONEachRow, "{}\n{ }").columns[0].null_map,
            (std::vector<uint8_t>{1, 1}));
}

// Row ends are found sixty-four bytes at a time: braces, quotes and escapes inside strings land on
// every offset of such a block (strings of growing length, rows after padding of every width),
// and every row still ends at its own '}', read whole, a byte at a time or cut into segments.
TEST(RowParserJson, RowEndsAtEveryOffsetOfTheScanBlocks) {
  const auto schema = schemaOf({{"s", "String"}, {"t", "String"}, {"n", "UInt32"}});
  std::string input;
  std::vector<std::string> expected_s;
  std::vector<std::string> expected_t;
  for (uint32_t k = 0; k < 140; ++k) {
    input += std::string(k % 67, k % 2 ? ' ' : '\n');
    // s: escapes (a quote, a backslash) after k bytes; t: braces and no escape at all.
    input += fmt::format(R"({{"s":"{}}}\"\\{{","t":"{}}}{{}}","n":{}}})", std::string(k, 'a'),
                         std::string(140 - k, 'b'), k);
    expected_s.push_back(std::string(k, 'a') + "}\"\\{");
    expected_t.push_back(std::string(140 - k, 'b') + "}{}");
  }
  input += "\n";
  for (std::size_t segment : {std::size_t{0}, std::size_t{1}, std::size_t{300}}) {
    for (Chunking chunking : {Chunking::kWhole, Chunking::kByteAtATime, Chunking::kRandom}) {
      auto parsed = parse(schema, RowFormat::kJSONEachRow, input, chunking, 65536, 3, segment);
      ASSERT_TRUE(parsed) << parsed.error().toString() << " segment " << segment;
      EXPECT_EQ(values<std::string>(parsed->all, 0), expected_s) << "segment " << segment;
      EXPECT_EQ(values<std::string>(parsed->all, 1), expected_t) << "segment " << segment;
      EXPECT_EQ(parsed->all.rows(), 140u);
    }
  }
}

TEST(RowParserTsv, EscapesAndLineEndsLikeClickHouse) {
  const auto schema = schemaOf({{"s", "String"}, {"n", "Nullable(String)"}});
  const Block block = parseOk(schema, RowFormat::kTabSeparated,
                              "a\\tb\\nc\\\\d\\0e\\bf\\fg\\rh\\'i\\\"\\/\t\\N\r\n"
                              "\t\n"
                              "last\twithout newline");
  ASSERT_EQ(block.rows(), 3u);
  EXPECT_EQ(values<std::string>(block, 0),
            (std::vector<std::string>{"a\tb\nc\\d\0e\bf\fg\rh'i\"/"s, "", "last"}));
  EXPECT_EQ(block.columns[1].null_map, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(values<std::string>(block, 1)[2], "without newline");
}

TEST(RowParserCsv, QuotingEmptyFieldsAndNullsLikeClickHouse) {
  const auto schema = schemaOf({{"i", "UInt8"},
                                {"s", "String"},
                                {"ns", "Nullable(String)"},
                                {"ni", "Nullable(Int8)"},
                                {"d", "Date"}});
  const Block block = parseOk(schema, RowFormat::kCSV,
                              ",,,,\n"
                              "\"7\",\"\",\"\",\"-1\",\"2026-12-01\"\r\n"
                              " 8 , x y ,\"\\N\",\\N,\"1970-01-02\" \n"
                              "9,\"multi\r\nline \"\"quoted\"\"\",'single',\\N,2026-12-01");
  ASSERT_EQ(block.rows(), 4u);
  // An unquoted empty field is the type's default, NULL when Nullable
  // (input_format_csv_empty_as_default=1); a quoted empty one is the empty string.
  EXPECT_EQ(values<uint8_t>(block, 0), (std::vector<uint8_t>{0, 7, 8, 9}));
  EXPECT_EQ(values<std::string>(block, 1),
            (std::vector<std::string>{"", "", "x y", "multi\r\nline \"quoted\""}));
  EXPECT_EQ(block.columns[2].null_map, (std::vector<uint8_t>{1, 0, 0, 0}));
  EXPECT_EQ(values<std::string>(block, 2), (std::vector<std::string>{"", "", "\\N", "'single'"}));
  EXPECT_EQ(block.columns[3].null_map, (std::vector<uint8_t>{1, 0, 1, 1}));
  EXPECT_EQ(values<int8_t>(block, 3)[1], -1);
  EXPECT_EQ(values<uint16_t>(block, 4), (std::vector<uint16_t>{0, 20788, 1, 20788}));
}

TEST(RowWriter, PrintsValuesAsClickHouseDoes) {
  const auto schema = schemaOf({{"u", "UInt64"},
                                {"i", "Int8"},
                                {"f", "Float32"},
                                {"d", "Float64"},
                                {"s", "String"},
                                {"day", "Date"},
                                {"at", "DateTime"},
                                {"b", "Bool"},
                                {"n", "Nullable(Int32)"}});
  Block block = schema.emptyBlock();
  values<uint64_t>(block, 0) = {UINT64_MAX, 0};
  values<int8_t>(block, 1) = {-128, 5};
  values<float>(block, 2) = {0.1f, std::numeric_limits<float>::quiet_NaN()};
  values<double>(block, 3) = {0.1, -std::numeric_limits<double>::infinity()};
  values<std::string>(block, 4) = {"a\"b\\c/d\te\x01\xFF\xE2\x80\xA8'", ""};
  values<uint16_t>(block, 5) = {20788, 0};
  values<uint32_t>(block, 6) = {1764558000, 0};
  values<uint8_t>(block, 7) = {1, 0};
  values<int32_t>(block, 8) = {0, -3};
  block.columns[8].null_map = {1, 0};
  std::string json;
  writeRows(block, RowFormat::kJSONEachRow, json);
  EXPECT_EQ(json,
            "{\"u\":18446744073709551615,\"i\":-128,\"f\":0.1,\"d\":0.1,"
            "\"s\":\"a\\\"b\\\\c\\/d\\te\\u0001\xEF\xBF\xBD\\u2028'\",\"day\":\"2026-12-01\","
            "\"at\":\"2025-12-01 03:00:00\",\"b\":true,\"n\":null}\n"
            "{\"u\":0,\"i\":5,\"f\":\"nan\",\"d\":\"-inf\",\"s\":\"\",\"day\":\"1970-01-01\","
            "\"at\":\"1970-01-01 00:00:00\",\"b\":false,\"n\":-3}\n");
  std::string tsv;
  writeRows(block, RowFormat::kTabSeparated, tsv);
  EXPECT_EQ(
      tsv,
      "18446744073709551615\t-128\t0.1\t0.1\ta\"b\\\\c/d\\te\x01\xFF\xE2\x80\xA8\\'\t2026-12-01\t"
      "2025-12-01 03:00:00\ttrue\t\\N\n"
      "0\t5\tnan\t-inf\t\t1970-01-01\t1970-01-01 00:00:00\tfalse\t-3\n");
  std::string csv;
  writeRows(block, RowFormat::kCSV, csv);
  EXPECT_EQ(
      csv,
      "18446744073709551615,-128,0.1,0.1,\"a\"\"b\\c/d\te\x01\xFF\xE2\x80\xA8'\",\"2026-12-01\","
      "\"2025-12-01 03:00:00\",true,\\N\n"
      "0,5,nan,-inf,\"\",\"1970-01-01\",\"1970-01-01 00:00:00\",false,-3\n");
}

// Errors: each names the row (counted across the stream) and the column when there is one.
struct ErrorCase {
  RowFormat format;
  std::string input;
  std::string expected;  // ParseError::toString()
};

TEST(RowParserErrors, NameTheRowAndTheColumn) {
  const auto schema = schemaOf({{"a", "UInt8"},
                                {"n", "Int64"},
                                {"u", "UInt32"},
                                {"s", "String"},
                                {"d", "Date"},
                                {"x", "Nullable(Int32)"}});
  const std::string json_ok = "{\"a\":1,\"n\":2,\"u\":3,\"s\":\"abc\",\"d\":\"2026-12-01\"}\n";
  const std::string tsv_ok = "1\t2\t3\tabc\t2026-12-01\t\\N\n";
  const std::string csv_ok = "1,2,3,\"abc\",2026-12-01,\\N\n";
  auto json = [&](std::string row) { return json_ok + row; };
  const std::vector<ErrorCase> cases = {
      // JSONEachRow
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":12x}"),
       "row 2, column 'n': malformed JSON value '12x'"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,,\"n\":1}"),
       "row 2: expected a key in '\"', got ','"},
      {RowFormat::kJSONEachRow, json("{\"a\" 1}"),
       "row 2, column 'a': expected ':' after the key, got '1'"},
      {RowFormat::kJSONEachRow, json_ok + "[1]",
       "row 2: expected '{' at the start of a row, got '['"},
      {RowFormat::kJSONEachRow, json("{\"a\":\"abc\"}"),
       "row 2, column 'a': value 'abc' is not a valid UInt8"},
      {RowFormat::kJSONEachRow, json("{\"a\":[1]}"),
       "row 2, column 'a': expected UInt8, got an array"},
      {RowFormat::kJSONEachRow, json("{\"d\":20000}"),
       "row 2, column 'd': expected a Date string \"YYYY-MM-DD\", got 20000"},
      {RowFormat::kJSONEachRow, json("{\"a\":300}"),
       "row 2, column 'a': value '300' is out of range for UInt8"},
      {RowFormat::kJSONEachRow, json("{\"a\":-1}"),
       "row 2, column 'a': value '-1' is out of range for UInt8"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":9223372036854775808}"),
       "row 2, column 'n': value '9223372036854775808' is out of range for Int64"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":\"-9223372036854775809\"}"),
       "row 2, column 'n': value '-9223372036854775809' is out of range for Int64"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":2,\"u\":1.5}"),
       "row 2, column 'u': value '1.5' is not a valid UInt32: not an integer"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"zz\":1}"),
       "row 2, column 'zz': no such column in the table"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"a\":1}"),
       "row 2, column 'a': appears twice in the row"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":2,\"s\":\"\",\"d\":\"2026-12-01\"}"),
       "row 2, column 'u': missing, and the column is not Nullable"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":2,\"u\":3,\"s\":null}"),
       "row 2, column 's': null, and the column is not Nullable"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"n\":2,\"u\":3,\"s\":\"\",\"d\":\"2026-02-30\"}"),
       "row 2, column 'd': '2026-02-30' is not a valid date"},
      {RowFormat::kJSONEachRow, json("{\"s\":\"a\\qb\"}"),
       "row 2, column 's': invalid escape '\\q' in a string"},
      {RowFormat::kJSONEachRow, json("{\"s\":\"\\ud800x\"}"),
       "row 2, column 's': invalid \\u escape: high surrogate \\uD800 is not followed by a low "
       "one"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,\"s\":\"abc"),
       "row 2, column 's': unterminated string"},
      {RowFormat::kJSONEachRow, json("{\"a\":1,"),
       "row 2: expected a key in '\"', got end of data"},
      {RowFormat::kJSONEachRow, json("{\"a\":{\"b\":1}}"),
       "row 2, column 'a': expected UInt8, got an object"},
      // TabSeparated
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\n",
       "row 2, column 'u': missing: the row has 2 fields, the table has 6 columns"},
      {RowFormat::kTabSeparated, tsv_ok + "\n",
       "row 2, column 'n': missing: the row has 1 field, the table has 6 columns"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\tabc\t2026-12-01\t\\N\t7\n",
       "row 2: too many fields: the row has 7, the table has 6 columns"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\ta\\qc\t2026-12-01\t\\N\n",
       "row 2, column 's': invalid escape '\\q'"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\tabc\\\t2026-12-01\t\\N\n",
       "row 2, column 's': a lone '\\' at the end of the value"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\tab\\Nc\t2026-12-01\t\\N\n",
       "row 2, column 's': '\\N' (NULL) must be the whole value"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\t\\N\t2026-12-01\t\\N\n",
       "row 2, column 's': \\N (NULL), and the column is not Nullable"},
      {RowFormat::kTabSeparated, tsv_ok + "300\t2\t3\tabc\t2026-12-01\t\\N\n",
       "row 2, column 'a': value '300' is out of range for UInt8"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t9223372036854775808\t3\tabc\t2026-12-01\t\\N\n",
       "row 2, column 'n': value '9223372036854775808' is out of range for Int64"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t1.5\tabc\t2026-12-01\t\\N\n",
       "row 2, column 'u': value '1.5' is not a valid UInt32: not an integer"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t 2\t3\tabc\t2026-12-01\t\\N\n",
       "row 2, column 'n': value ' 2' is not a valid Int64"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\tabc\t2026-12-01\t5x\n",
       "row 2, column 'x': value '5x' is not a valid Int32"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\tabc\t2026-13-01\t\\N\n",
       "row 2, column 'd': '2026-13-01' is not a valid date"},
      {RowFormat::kTabSeparated, tsv_ok + "1\t2\t3\tabc\t\t\\N\n",
       "row 2, column 'd': '' is not a date YYYY-MM-DD"},
      // CSV
      {RowFormat::kCSV, csv_ok + "1,2,3,\"abc,2026-12-01,\\N\n",
       "row 2, column 's': unterminated quoted value"},
      {RowFormat::kCSV, csv_ok + "1,2,3,\"ab\"c,2026-12-01,\\N\n",
       "row 2, column 's': unexpected 'c' after the closing quote"},
      {RowFormat::kCSV, csv_ok + "1,2,3,abc,2026-12-01\n",
       "row 2, column 'x': missing: the row has 5 fields, the table has 6 columns"},
      {RowFormat::kCSV, csv_ok + "1,2,3,abc,2026-12-01,,\n",
       "row 2: too many fields, the table has 6 columns"},
      {RowFormat::kCSV, csv_ok + "1,2,3,abc,2026-1-01,\n",
       "row 2, column 'd': '2026-1-01' is not a date YYYY-MM-DD"},
      {RowFormat::kCSV, csv_ok + "1,-9223372036854775809,3,abc,2026-12-01,\n",
       "row 2, column 'n': value '-9223372036854775809' is out of range for Int64"},
      {RowFormat::kCSV, csv_ok + "1,2,\"1.5\",abc,2026-12-01,\n",
       "row 2, column 'u': value '1.5' is not a valid UInt32: not an integer"},
      {RowFormat::kCSV, csv_ok + "1,2,3,\\N,2026-12-01,\n",
       "row 2, column 's': \\N (NULL), and the column is not Nullable"},
  };
  for (const auto& c : cases) {
    for (Chunking chunking : {Chunking::kWhole, Chunking::kByteAtATime}) {
      auto parsed = parse(schema, c.format, c.input, chunking);
      ASSERT_FALSE(parsed) << c.input;
      EXPECT_EQ(parsed.error().toString(), c.expected)
          << rowFormatName(c.format) << ": " << c.input;
      EXPECT_EQ(parsed.error().row, 2u);
    }
  }
}

TEST(RowParserErrors, OtherTypesAndTheStreamAfterAnError) {
  const auto schema = schemaOf({{"b", "Bool"}, {"t", "DateTime"}, {"f", "Float32"}});
  EXPECT_EQ(parseError(schema, RowFormat::kTabSeparated, "yes\t0\t0\n").toString(),
            "row 1, column 'b': value 'yes' is not a valid Bool (true, false, 1 or 0)");
  EXPECT_EQ(parseError(schema, RowFormat::kCSV, "true,2026-12-01 24:00:00,0\n").toString(),
            "row 1, column 't': '2026-12-01 24:00:00' is not a valid date-time");
  EXPECT_EQ(parseError(schema, RowFormat::kJSONEachRow, "{\"b\":1,\"t\":0,\"f\":1e39}").toString(),
            "row 1, column 'f': value '1e39' is out of range for Float32");
  EXPECT_EQ(parseError(schema, RowFormat::kJSONEachRow, "{\"b\":1,\"t\":-1,\"f\":0}").column, "t");
  EXPECT_EQ(parseError(schema, RowFormat::kJSONEachRow, "{\"b\":2,\"t\":0,\"f\":0}").column, "b");
  const std::string long_value(1000, '7');
  EXPECT_EQ(parseError(schema, RowFormat::kCSV, "1,0," + long_value + "x\n").message,
            "value '" + long_value.substr(0, 64) + "...' is not a valid Float32");

  // The first error sticks: later feeds and finish() return it, and no block is handed out.
  RowParser parser(schema, RowFormat::kTabSeparated, 1);
  std::size_t blocks = 0;
  auto count = [&](Block&&) { ++blocks; };
  ASSERT_TRUE(parser.feed("true\t0\t1\nfalse\t0\tnope\n", count) ==
              std::unexpected(ParseError{2, "f", "value 'nope' is not a valid Float32"}));
  EXPECT_EQ(blocks, 1u);
  EXPECT_EQ(parser.rowsParsed(), 1u);
  EXPECT_EQ(parser.feed("true\t0\t1\n", count).error().row, 2u);
  EXPECT_EQ(parser.finish(count).error().row, 2u);
  EXPECT_EQ(blocks, 1u);
}

}  // namespace
}  // namespace rtable::core
