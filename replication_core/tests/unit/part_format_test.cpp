#include "rtable/replication_core/part_format.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <random>
#include <set>

#include "rtable/common/testing/files.h"
#include "rtable/replication_core/hash128.h"

namespace rtable::core {
namespace {

namespace fs = std::filesystem;
using common::testing::readFile;
using common::testing::writeFile;

DataType type(std::string_view text) {
  auto parsed = DataType::parse(text);
  EXPECT_TRUE(parsed) << parsed.error();
  return *parsed;
}

TableSchema schemaOf(std::vector<std::pair<std::string, std::string>> columns) {
  std::vector<ColumnSpec> specs;
  for (const auto& [name, type_name] : columns) specs.push_back({name, type(type_name)});
  auto schema = TableSchema::create(std::move(specs), {}, {});
  EXPECT_TRUE(schema) << schema.error();
  return *schema;
}

PartName partNamed(std::string_view name) {
  return *PartName::parse(name);
}

std::set<std::string> listDir(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename());
  return names;
}

// Values for every row of every column of `schema`: the type's extremes (and for floats NaN,
// infinities, -0.0; for strings "" and bytes with \0) first, then seeded random values. Nullable
// columns get a NULL in about a third of the rows, the default value under it.
Block makeRows(const TableSchema& schema, std::size_t rows, uint64_t seed) {
  std::mt19937_64 random(seed);
  Block block = schema.emptyBlock();
  for (Column& column : block.columns) {
    std::visit(
        [&](auto& values) {
          using T = typename std::decay_t<decltype(values)>::value_type;
          std::vector<T> specials;
          if constexpr (std::is_same_v<T, std::string>) {
            specials = {"", std::string("\0a\xff\0", 4), "plain"};
          } else if constexpr (std::is_floating_point_v<T>) {
            using L = std::numeric_limits<T>;
            specials = {L::quiet_NaN(),  L::infinity(), -L::infinity(), T(-0.0),
                        L::denorm_min(), L::max(),      L::lowest(),    T(0.1)};
          } else if (column.type.id == TypeId::kBool) {
            specials = {0, 1};
          } else {
            specials = {std::numeric_limits<T>::min(), std::numeric_limits<T>::max(), T{0}};
          }
          for (std::size_t row = 0; row < rows; ++row) {
            const bool null = column.type.nullable && random() % 3 == 0;
            if (column.type.nullable) column.null_map.push_back(null ? 1 : 0);
            if (null) {
              values.push_back(T{});
            } else if (row < specials.size()) {
              values.push_back(specials[row]);
            } else if constexpr (std::is_same_v<T, std::string>) {
              std::string value(random() % 40, '\0');
              for (char& c : value) c = static_cast<char>(random());
              values.push_back(std::move(value));
            } else if constexpr (std::is_floating_point_v<T>) {
              values.push_back(static_cast<T>(std::ldexp(double(random() % 1000000), -10)));
            } else if (column.type.id == TypeId::kBool) {
              values.push_back(static_cast<T>(random() % 2));
            } else {
              const uint64_t bits = random();
              T value;
              std::memcpy(&value, &bits, sizeof(T));
              values.push_back(value);
            }
          }
        },
        column.values);
  }
  return block;
}

// Block equality with floats compared by bits, so NaN equals NaN and -0.0 differs from 0.0.
void expectSameRows(const Block& actual, const Block& expected) {
  ASSERT_EQ(actual.columns.size(), expected.columns.size());
  for (std::size_t i = 0; i < actual.columns.size(); ++i) {
    const Column& a = actual.columns[i];
    const Column& e = expected.columns[i];
    SCOPED_TRACE(e.name);
    EXPECT_EQ(a.name, e.name);
    EXPECT_EQ(a.type, e.type);
    EXPECT_EQ(a.null_map, e.null_map);
    ASSERT_EQ(a.values.index(), e.values.index());
    std::visit(
        [&](const auto& expected_values) {
          const auto& actual_values = std::get<std::decay_t<decltype(expected_values)>>(a.values);
          using T = typename std::decay_t<decltype(expected_values)>::value_type;
          ASSERT_EQ(actual_values.size(), expected_values.size());
          if constexpr (std::is_floating_point_v<T>) {
            if (actual_values.empty()) return;  // data() may be null
            EXPECT_EQ(0, std::memcmp(actual_values.data(), expected_values.data(),
                                     actual_values.size() * sizeof(T)));
          } else {
            EXPECT_TRUE(actual_values == expected_values);
          }
        },
        e.values);
  }
}

class PartFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "rtable-part-format-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // A fresh table directory under the test's temporary directory.
  fs::path tableDir(std::string_view name) {
    fs::path dir = root_ / name;
    fs::create_directories(dir);
    return dir;
  }

  // Rewrites `file` in `part_dir` and its checksums.txt entry, as a consistent forgery would.
  static void rewriteWithChecksums(const fs::path& part_dir, const std::string& file,
                                   std::string_view content) {
    writeFile(part_dir / file, content);
    auto checksums = PartChecksums::parse(readFile(part_dir / "checksums.txt"));
    ASSERT_TRUE(checksums) << checksums.error();
    for (auto& entry : checksums->files) {
      if (entry.name == file) entry = {file, content.size(), hash128(content)};
    }
    writeFile(part_dir / "checksums.txt", PartChecksums::fromFiles(checksums->files).format());
  }

  const TableSchema small_schema_ =
      schemaOf({{"a", "UInt64"}, {"s", "String"}, {"n", "Nullable(Int32)"}});
  fs::path root_;
};

const TableSchema& everyTypeSchema() {
  static const TableSchema schema = schemaOf({
      {"u8", "UInt8"},
      {"u16", "UInt16"},
      {"u32", "UInt32"},
      {"u64", "UInt64"},
      {"i8", "Int8"},
      {"i16", "Int16"},
      {"i32", "Int32"},
      {"i64", "Int64"},
      {"f32", "Float32"},
      {"f64", "Float64"},
      {"s", "String"},
      {"d", "Date"},
      {"dt", "DateTime"},
      {"b", "Bool"},
      {"nu8", "Nullable(UInt8)"},
      {"ni64", "Nullable(Int64)"},
      {"nf32", "Nullable(Float32)"},
      {"nf64", "Nullable(Float64)"},
      {"ns", "Nullable(String)"},
      {"nd", "Nullable(Date)"},
      {"ndt", "Nullable(DateTime)"},
      {"nb", "Nullable(Bool)"},
  });
  return schema;
}

TEST_F(PartFormat, EveryTypeRoundTrips) {
  const TableSchema& schema = everyTypeSchema();
  for (std::size_t rows : {0, 1, 100000}) {
    SCOPED_TRACE(rows);
    const Block block = makeRows(schema, rows, rows);
    const fs::path table = tableDir("t" + std::to_string(rows));
    auto written = writePart(table, partNamed("all_1_1_0"), schema, block);
    ASSERT_TRUE(written) << written.error();
    auto verified = verifyPart(table / "all_1_1_0", schema);
    ASSERT_TRUE(verified) << verified.error();
    EXPECT_EQ(*verified, *written);
    auto read = readPart(table / "all_1_1_0", schema);
    ASSERT_TRUE(read) << read.error();
    expectSameRows(*read, block);
    EXPECT_EQ(readFile(table / "all_1_1_0" / "count.txt"), std::to_string(rows));
  }
}

TEST_F(PartFormat, LargeStringsSpanCompressedBlocks) {
  const TableSchema schema = schemaOf({{"s", "String"}, {"ns", "Nullable(String)"}});
  std::mt19937_64 random(7);
  std::string noise(3 << 20, '\0');  // incompressible: 3 MiB stay 3 MiB, over several blocks
  for (char& c : noise) c = static_cast<char>(random());
  Block block = schema.emptyBlock();
  std::get<std::vector<std::string>>(block.columns[0].values) = {
      "", noise, std::string(3 << 20, 'x'), std::string("\0\0", 2)};
  std::get<std::vector<std::string>>(block.columns[1].values) = {noise, "", "", "z"};
  block.columns[1].null_map = {0, 1, 0, 0};
  const fs::path table = tableDir("t");
  auto written = writePart(table, partNamed("all_1_1_0"), schema, block);
  ASSERT_TRUE(written) << written.error();
  EXPECT_GT(fs::file_size(table / "all_1_1_0" / "s.bin"), noise.size());
  auto read = readPart(table / "all_1_1_0", schema);
  ASSERT_TRUE(read) << read.error();
  expectSameRows(*read, block);
  auto verified = verifyPart(table / "all_1_1_0", schema);
  EXPECT_TRUE(verified) << verified.error();
}

TEST_F(PartFormat, WritesClickHouseTextFilesAndChecksums) {
  Block block = small_schema_.emptyBlock();
  std::get<std::vector<uint64_t>>(block.columns[0].values) = {1, 2, 3};
  std::get<std::vector<std::string>>(block.columns[1].values) = {"a", "", "c"};
  std::get<std::vector<int32_t>>(block.columns[2].values) = {-1, 0, 7};
  block.columns[2].null_map = {0, 1, 0};
  const fs::path table = tableDir("t");
  auto written = writePart(table, partNamed("202612_4_4_0"), small_schema_, block);
  ASSERT_TRUE(written) << written.error();

  EXPECT_EQ(listDir(table), std::set<std::string>{"202612_4_4_0"});
  const fs::path dir = table / "202612_4_4_0";
  EXPECT_EQ(listDir(dir), (std::set<std::string>{"a.bin", "checksums.txt", "columns.txt",
                                                 "count.txt", "n.bin", "s.bin"}));
  EXPECT_EQ(readFile(dir / "columns.txt"),
            "columns format version: 1\n3 columns:\n`a` UInt64\n`s` String\n"
            "`n` Nullable(Int32)\n");
  EXPECT_EQ(readFile(dir / "count.txt"), "3");

  auto parsed = PartChecksums::parse(readFile(dir / "checksums.txt"));
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, *written);
  std::vector<std::string> names;
  for (const auto& file : written->files) {
    names.push_back(file.name);
    const std::string content = readFile(dir / file.name);
    EXPECT_EQ(file.size, content.size()) << file.name;
    EXPECT_EQ(file.hash, hash128(content)) << file.name;
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"a.bin", "columns.txt", "count.txt", "n.bin", "s.bin"}));
  EXPECT_EQ(written->total, PartChecksums::totalOf(written->files));
}

TEST_F(PartFormat, SameBlockGivesByteIdenticalFiles) {
  const TableSchema& schema = everyTypeSchema();
  const Block block = makeRows(schema, 20000, 42);
  auto first = writePart(tableDir("one"), partNamed("all_1_1_0"), schema, block);
  auto second = writePart(tableDir("two"), partNamed("all_1_1_0"), schema, block);
  ASSERT_TRUE(first) << first.error();
  ASSERT_TRUE(second) << second.error();
  EXPECT_EQ(first->total, second->total);
  for (const auto& name : listDir(root_ / "one" / "all_1_1_0")) {
    EXPECT_TRUE(readFile(root_ / "one" / "all_1_1_0" / name) ==
                readFile(root_ / "two" / "all_1_1_0" / name))
        << name;
  }

  Block other = block;
  std::get<std::vector<uint64_t>>(other.columns[3].values)[19999] ^= 1;
  auto different = writePart(tableDir("three"), partNamed("all_1_1_0"), schema, other);
  ASSERT_TRUE(different) << different.error();
  EXPECT_NE(different->total, first->total);
}

TEST_F(PartFormat, RefusesAnExistingPartAndLeavesNothingBehind) {
  const fs::path table = tableDir("t");
  const Block block = makeRows(small_schema_, 10, 1);
  auto first = writePart(table, partNamed("all_1_1_0"), small_schema_, block);
  ASSERT_TRUE(first) << first.error();

  auto again =
      writePart(table, partNamed("all_1_1_0"), small_schema_, makeRows(small_schema_, 5, 2));
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().find("all_1_1_0: already exists"), std::string::npos) << again.error();
  EXPECT_EQ(listDir(table), std::set<std::string>{"all_1_1_0"});
  auto verified = verifyPart(table / "all_1_1_0", small_schema_);
  ASSERT_TRUE(verified) << verified.error();
  EXPECT_EQ(*verified, *first);

  // A block that does not fit the schema: refused before anything is created.
  Block wrong = block;
  wrong.columns[2].null_map.pop_back();
  auto mismatched = writePart(table, partNamed("all_2_2_0"), small_schema_, wrong);
  ASSERT_FALSE(mismatched);
  EXPECT_NE(mismatched.error().find("column 'n' has a null map of 9 entries for 10 rows"),
            std::string::npos)
      << mismatched.error();
  EXPECT_EQ(listDir(table), std::set<std::string>{"all_1_1_0"});

  // Another write of the same part in progress (its tmp_ directory exists): refused, untouched.
  fs::create_directory(table / "tmp_all_3_3_0");
  auto concurrent = writePart(table, partNamed("all_3_3_0"), small_schema_, block);
  ASSERT_FALSE(concurrent);
  EXPECT_NE(concurrent.error().find("tmp_all_3_3_0"), std::string::npos) << concurrent.error();
  EXPECT_EQ(listDir(table), (std::set<std::string>{"all_1_1_0", "tmp_all_3_3_0"}));

  auto no_table = writePart(root_ / "missing", partNamed("all_1_1_0"), small_schema_, block);
  EXPECT_FALSE(no_table);
}

TEST_F(PartFormat, StagedPartIsTheSamePartWrittenInPlace) {
  const fs::path table = tableDir("t");
  const fs::path staging = tableDir("staging");
  const Block block = makeRows(small_schema_, 1000, 7);
  auto staged = writeStagedPart(staging / "all_0_0_0", small_schema_, block);
  ASSERT_TRUE(staged) << staged.error();
  // No tmp_ directory and no rename inside the staging area: the caller's rename publishes it.
  EXPECT_EQ(listDir(staging), std::set<std::string>{"all_0_0_0"});
  fs::rename(staging / "all_0_0_0", table / "all_5_5_0");
  auto verified = verifyPart(table / "all_5_5_0", small_schema_);
  ASSERT_TRUE(verified) << verified.error();
  EXPECT_EQ(*verified, *staged);
  auto in_place = writePart(tableDir("other"), partNamed("all_5_5_0"), small_schema_, block);
  ASSERT_TRUE(in_place) << in_place.error();
  EXPECT_EQ(in_place->total, staged->total);

  // An existing directory is refused and kept; a block that does not fit leaves nothing.
  fs::create_directory(staging / "all_1_1_0");
  auto exists = writeStagedPart(staging / "all_1_1_0", small_schema_, block);
  ASSERT_FALSE(exists);
  EXPECT_NE(exists.error().find("it exists"), std::string::npos) << exists.error();
  EXPECT_TRUE(fs::is_directory(staging / "all_1_1_0"));
  Block wrong = block;
  wrong.columns[2].null_map.pop_back();
  auto mismatched = writeStagedPart(staging / "all_2_2_0", small_schema_, wrong);
  ASSERT_FALSE(mismatched);
  EXPECT_FALSE(fs::exists(staging / "all_2_2_0"));
}

struct Corruption {
  std::string what;
  std::function<void(const fs::path&)> apply;
  std::string file;    // the file the error must name
  std::string reason;  // and a part of its reason
  bool breaks_read;    // readPart fails too
};

TEST_F(PartFormat, VerifyNamesTheCorruptFileAndTheReason) {
  const std::vector<Corruption> corruptions = {
      {"one byte of a column flipped",
       [](const fs::path& dir) {
         std::string bytes = readFile(dir / "s.bin");
         bytes[bytes.size() / 2] ^= 0x01;
         writeFile(dir / "s.bin", bytes);
       },
       "s.bin", "hash", true},
      {"a column truncated",
       [](const fs::path& dir) {
         fs::resize_file(dir / "a.bin", fs::file_size(dir / "a.bin") - 1);
       },
       "a.bin", "size", true},
      {"a column deleted", [](const fs::path& dir) { fs::remove(dir / "n.bin"); }, "n.bin",
       "missing", true},
      {"an extra file", [](const fs::path& dir) { writeFile(dir / "extra.bin", "x"); }, "extra.bin",
       "not listed in checksums.txt", false},
      {"count.txt edited", [](const fs::path& dir) { writeFile(dir / "count.txt", "4001"); },
       "count.txt", "hash", true},
      {"columns.txt edited",
       [](const fs::path& dir) {
         std::string text = readFile(dir / "columns.txt");
         text.replace(text.find("UInt64"), 6, "UInt32");
         writeFile(dir / "columns.txt", text);
       },
       "columns.txt", "hash", true},
      {"checksums.txt total edited",
       [](const fs::path& dir) {
         std::string text = readFile(dir / "checksums.txt");
         char& digit = text[text.size() - 2];
         digit = digit == '0' ? '1' : '0';
         writeFile(dir / "checksums.txt", text);
       },
       "checksums.txt", "line 8: total", true},
      {"checksums.txt deleted", [](const fs::path& dir) { fs::remove(dir / "checksums.txt"); },
       "checksums.txt", "No such file", true},
      {"a directory inside the part",
       [](const fs::path& dir) { fs::create_directory(dir / "sub"); }, "sub",
       "not listed in checksums.txt", false},
  };
  const Block block = makeRows(small_schema_, 5000, 3);
  for (std::size_t i = 0; i < corruptions.size(); ++i) {
    const Corruption& corruption = corruptions[i];
    SCOPED_TRACE(corruption.what);
    const fs::path table = tableDir("t" + std::to_string(i));
    ASSERT_TRUE(writePart(table, partNamed("all_1_1_0"), small_schema_, block));
    const fs::path dir = table / "all_1_1_0";
    corruption.apply(dir);

    auto verified = verifyPart(dir, small_schema_);
    ASSERT_FALSE(verified);
    EXPECT_NE(verified.error().find("part " + dir.string() + ": " + corruption.file + ": "),
              std::string::npos)
        << verified.error();
    EXPECT_NE(verified.error().find(corruption.reason), std::string::npos) << verified.error();

    auto read = readPart(dir, small_schema_);
    EXPECT_EQ(!read, corruption.breaks_read);
    if (!read) {
      EXPECT_NE(read.error().find(corruption.file), std::string::npos) << read.error();
    }
  }
}

TEST_F(PartFormat, ConsistentButWrongContentIsStillCaught) {
  const Block block = makeRows(small_schema_, 100, 4);
  const fs::path table = tableDir("t");
  ASSERT_TRUE(writePart(table, partNamed("all_1_1_0"), small_schema_, block));
  const fs::path dir = table / "all_1_1_0";

  // count.txt and checksums.txt agree, the columns do not.
  rewriteWithChecksums(dir, "count.txt", "101");
  auto more = verifyPart(dir, small_schema_);
  ASSERT_FALSE(more);
  EXPECT_NE(more.error().find("a.bin: 101 rows of UInt64: values: data ends after 800"),
            std::string::npos)
      << more.error();
  rewriteWithChecksums(dir, "count.txt", "99");
  auto fewer = readPart(dir, small_schema_);
  ASSERT_FALSE(fewer);
  EXPECT_NE(fewer.error().find("a.bin: 99 rows of UInt64: holds more than count.txt's 99 rows"),
            std::string::npos)
      << fewer.error();
  rewriteWithChecksums(dir, "count.txt", "1e2");
  auto garbled = verifyPart(dir, small_schema_);
  ASSERT_FALSE(garbled);
  EXPECT_NE(garbled.error().find("count.txt: '1e2' is not a row count"), std::string::npos)
      << garbled.error();
  rewriteWithChecksums(dir, "count.txt", "100");
  ASSERT_TRUE(verifyPart(dir, small_schema_));

  // A block header asking for 4 GiB: refused before any allocation.
  rewriteWithChecksums(dir, "a.bin", std::string("\x90\xff\xff\xff\xff\xff\xff\xff\xff", 9));
  auto huge = readPart(dir, small_schema_);
  ASSERT_FALSE(huge);
  EXPECT_NE(huge.error().find("a.bin: 100 rows of UInt64: values: block at byte 0: sizes "
                              "4294967295 -> 4294967295 are out of range"),
            std::string::npos)
      << huge.error();

  // The part read with another table's schema.
  ASSERT_TRUE(writePart(table, partNamed("all_2_2_0"), small_schema_, block));
  const TableSchema other = schemaOf({{"a", "UInt64"}, {"s", "String"}, {"n", "Nullable(Int64)"}});
  auto verified = verifyPart(table / "all_2_2_0", other);
  auto read = readPart(table / "all_2_2_0", other);
  ASSERT_FALSE(verified);
  ASSERT_FALSE(read);
  for (const std::string& error : {verified.error(), read.error()}) {
    EXPECT_NE(error.find("columns.txt: does not match the table's schema: line 5 is "
                         "'`n` Nullable(Int32)', the schema has '`n` Nullable(Int64)'"),
              std::string::npos)
        << error;
  }
}

class PartLoading : public PartFormat {};

TEST_F(PartLoading, MovesBrokenPartsAsideKeepsGoodOnesAndLeavesStrangersAlone) {
  const fs::path table = tableDir("t");
  std::vector<PartChecksums> written;
  for (int n = 1; n <= 3; ++n) {
    auto checksums =
        writePart(table, partNamed("all_" + std::to_string(n) + "_" + std::to_string(n) + "_0"),
                  small_schema_, makeRows(small_schema_, 100 * n, n));
    ASSERT_TRUE(checksums) << checksums.error();
    written.push_back(*checksums);
  }
  auto flipByte = [](const fs::path& file) {
    std::string bytes = readFile(file);
    bytes[bytes.size() / 2] ^= 0x40;
    writeFile(file, bytes);
  };
  flipByte(table / "all_2_2_0" / "a.bin");
  fs::create_directory(table / "tmp_all_4_4_0");  // a write cut short by a crash
  writeFile(table / "tmp_all_4_4_0" / "a.bin", "half");
  fs::create_directory(table / "notes");
  writeFile(table / "README", "mine");
  fs::create_directory(table / "all_01_1_0");
  writeFile(table / "all_5_5_0", "a file with a part's name");

  auto loaded = loadParts(table, small_schema_);
  ASSERT_TRUE(loaded) << loaded.error();
  ASSERT_EQ(loaded->valid.size(), 2u);
  EXPECT_EQ(loaded->valid[0].first, partNamed("all_1_1_0"));
  EXPECT_EQ(loaded->valid[0].second, written[0]);
  EXPECT_EQ(loaded->valid[1].first, partNamed("all_3_3_0"));
  EXPECT_EQ(loaded->valid[1].second, written[2]);
  ASSERT_EQ(loaded->broken.size(), 1u);
  EXPECT_EQ(loaded->broken[0].first, "all_2_2_0");
  EXPECT_NE(loaded->broken[0].second.find("all_2_2_0: a.bin: hash"), std::string::npos)
      << loaded->broken[0].second;
  EXPECT_EQ(readFile(table / "detached" / "broken_all_2_2_0" / "reason.txt"),
            loaded->broken[0].second + "\n");
  EXPECT_TRUE(fs::exists(table / "detached" / "broken_all_2_2_0" / "a.bin"));
  EXPECT_EQ(loaded->removed_temporary, std::vector<std::string>{"tmp_all_4_4_0"});
  std::vector<std::string> ignored;
  for (const auto& [name, why] : loaded->ignored) ignored.push_back(name);
  EXPECT_EQ(ignored, (std::vector<std::string>{"README", "all_01_1_0", "all_5_5_0", "notes"}));
  EXPECT_EQ(listDir(table), (std::set<std::string>{"README", "all_01_1_0", "all_1_1_0", "all_3_3_0",
                                                   "all_5_5_0", "detached", "notes"}));

  // The same name breaks again: the earlier broken copy stays, the new one gets a suffix.
  ASSERT_TRUE(
      writePart(table, partNamed("all_2_2_0"), small_schema_, makeRows(small_schema_, 7, 7)));
  fs::remove(table / "all_2_2_0" / "count.txt");
  auto again = loadParts(table, small_schema_);
  ASSERT_TRUE(again) << again.error();
  EXPECT_EQ(again->valid.size(), 2u);
  ASSERT_EQ(again->broken.size(), 1u);
  EXPECT_NE(again->broken[0].second.find("count.txt: missing"), std::string::npos)
      << again->broken[0].second;
  EXPECT_EQ(listDir(table / "detached"),
            (std::set<std::string>{"broken_all_2_2_0", "broken_all_2_2_0_try1"}));
  EXPECT_TRUE(again->removed_temporary.empty());

  auto missing = loadParts(root_ / "nothing", small_schema_);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().find("nothing"), std::string::npos) << missing.error();
}

PartChecksums sampleChecksums() {
  return PartChecksums::fromFiles({{"count.txt", 1, hash128("7")},
                                   {"a.bin", 1234, hash128("a")},
                                   {"columns.txt", 40, hash128("columns")}});
}

TEST(PartChecksums, FormatAndParseRoundTrip) {
  const PartChecksums checksums = sampleChecksums();
  EXPECT_EQ(checksums.files[0].name, "a.bin");
  EXPECT_EQ(checksums.files[2].name, "count.txt");
  const std::string text = checksums.format();
  EXPECT_EQ(text,
            "rtable checksums format version: 1\n3 files:\n"
            "a.bin\t1234\t" +
                hash128("a").hex() + "\n" + "columns.txt\t40\t" + hash128("columns").hex() + "\n" +
                "count.txt\t1\t" + hash128("7").hex() + "\n" + "total: " + checksums.total.hex() +
                "\n");
  auto parsed = PartChecksums::parse(text);
  ASSERT_TRUE(parsed) << parsed.error();
  EXPECT_EQ(*parsed, checksums);
  EXPECT_EQ(parsed->format(), text);
  ASSERT_NE(parsed->find("columns.txt"), nullptr);
  EXPECT_EQ(parsed->find("columns.txt")->size, 40u);
  EXPECT_EQ(parsed->find("b.bin"), nullptr);

  const PartChecksums empty = PartChecksums::fromFiles({});
  EXPECT_EQ(PartChecksums::parse(empty.format()), empty);
  // The total covers names, sizes and hashes.
  auto renamed = checksums.files;
  renamed[0].name = "b.bin";
  EXPECT_NE(PartChecksums::totalOf(renamed), checksums.total);
  auto resized = checksums.files;
  resized[0].size += 1;
  EXPECT_NE(PartChecksums::totalOf(resized), checksums.total);
}

TEST(PartChecksums, ParseErrorsNameTheLine) {
  const std::string good = sampleChecksums().format();
  auto lines = [&] {
    std::vector<std::string> out;
    for (std::size_t start = 0; start < good.size();) {
      const std::size_t end = good.find('\n', start);
      out.push_back(good.substr(start, end - start));
      start = end + 1;
    }
    return out;
  }();
  auto join = [](const std::vector<std::string>& parts) {
    std::string text;
    for (const auto& part : parts) text += part + "\n";
    return text;
  };
  auto with = [&](std::size_t index, std::string line) {
    auto copy = lines;
    copy[index] = std::move(line);
    return join(copy);
  };
  auto swapped = lines;
  std::swap(swapped[2], swapped[3]);
  auto duplicated = lines;
  duplicated[3] = duplicated[2];
  auto without_total = lines;
  without_total.pop_back();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "line 1: expected 'rtable checksums format version: 1', found the end of the file"},
      {with(0, "checksums format version: 4"), "line 1: expected"},
      {with(1, "three files:"), "line 2: expected '<N> files:', found 'three files:'"},
      {with(2, "a.bin 1234 00"), "line 3: expected '<name>\\t<size>\\t<32 hex digits>'"},
      {with(2, "a.bin\t1234\t" + std::string(32, 'A')), "line 3: expected"},
      {with(2, "a.bin\t-1\t" + std::string(32, 'a')), "line 3: expected"},
      {with(2, "a/b.bin\t1\t" + std::string(32, 'a')), "line 3: 'a/b.bin' is not a file name"},
      {join(swapped), "line 4: file 'a.bin' is not after 'columns.txt'"},
      {join(duplicated), "line 4: file 'a.bin' is not after 'a.bin'"},
      {with(2, "a.bin\t1235\t" + hash128("a").hex()), "line 6: total"},
      {join(without_total), "line 6: expected 'total: <32 hex digits>', found the end"},
      {with(1, "4 files:"), "line 6: expected '<name>\\t<size>"},
      {with(1, "2 files:"), "line 5: expected 'total: <32 hex digits>', found 'count.txt"},
      {good.substr(0, good.size() - 1), "line 6: no newline at the end"},
      {good + "more\n", "line 7: unexpected text after the total: 'more'"},
  };
  for (const auto& [text, error] : cases) {
    auto parsed = PartChecksums::parse(text);
    ASSERT_FALSE(parsed) << text;
    EXPECT_NE(parsed.error().find(error), std::string::npos) << parsed.error();
  }
}

}  // namespace
}  // namespace rtable::core
