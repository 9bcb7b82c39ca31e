#include "rtable/replication_core/part_format.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

#include "posix_file.h"
#include "rtable/common/quoted_excerpt.h"
#include "rtable/replication_core/table_paths.h"

namespace rtable::core {
namespace fs = std::filesystem;

static_assert(std::endian::native == std::endian::little,
              "column files hold raw little-endian arrays");

namespace {

using common::quotedExcerpt;

using Status = std::expected<void, std::string>;
template <class T>
using Result = std::expected<T, std::string>;

// zstd's fastest standard level: on inserts compression is most of writing a part, and level 1
// still stores the benchmark's columns at about a third of their size. Part of the format: another
// level gives other bytes, and replicas that merge the same parts must write byte-identical
// results.
constexpr int kZstdLevel = 1;
// Uncompressed bytes per compressed block (ClickHouse's max_compress_block_size): bounds the
// memory of writers, readers and verifiers.
constexpr std::size_t kBlockBytes = 1 << 20;
// Each block starts with method (1 byte, ClickHouse's byte for ZSTD), compressed size and
// uncompressed size (u32 little-endian each).
constexpr uint8_t kMethodZstd = 0x90;
constexpr std::size_t kBlockHeaderBytes = 9;
// A bigger columns.txt, count.txt or checksums.txt is not one we wrote.
constexpr std::size_t kMaxTextFileBytes = 16 << 20;
constexpr std::size_t kReadChunkBytes = 1 << 16;

constexpr std::string_view kColumnsFile = "columns.txt";
constexpr std::string_view kCountFile = "count.txt";
constexpr std::string_view kReasonFile = "reason.txt";
constexpr std::string_view kTemporaryPrefix = "tmp_";
constexpr std::string_view kBrokenPrefix = "broken_";
constexpr std::string_view kChecksumsHeader = "rtable checksums format version: 1";

std::string fileError(const fs::path& part_dir, std::string_view file, std::string_view what) {
  return fmt::format("part {}: {}: {}", part_dir.string(), file, what);
}

template <class T>
std::optional<T> parseDecimal(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || text[0] < '0' || text[0] > '9' || ec != std::errc() || ptr != end) {
    return std::nullopt;
  }
  return value;
}

// --- Files -----------------------------------------------------------------------------------

// A new file, hashed as it is written; finish() fsyncs and closes it. In memory (a PartImage's
// file), the bytes collect in memory() instead.
class FileWriter {
 public:
  static Result<FileWriter> create(const fs::path& path, bool replace = false) {
    auto fd = openFd(path, O_WRONLY | O_CREAT | (replace ? O_TRUNC : O_EXCL), 0644);
    if (!fd) return std::unexpected(fd.error());
    return FileWriter(path.filename().string(), std::move(*fd));
  }
  static FileWriter inMemory(std::string name) {
    FileWriter writer(std::move(name), Fd());
    writer.in_memory_ = true;
    return writer;
  }

  Status write(const void* data, std::size_t size) {
    hasher_.update(data, size);
    size_ += size;
    const char* p = static_cast<const char*>(data);
    if (in_memory_) {
      memory_.append(p, size);
      return {};
    }
    return writeAll(fd_, std::string_view(p, size));
  }

  Result<PartChecksums::File> finish() {
    if (in_memory_) return PartChecksums::File{name_, size_, hasher_.digest()};
    if (auto synced = fsyncFd(fd_); !synced) return std::unexpected(synced.error());
    if (auto closed = fd_.close(); !closed) return std::unexpected(closed.error());
    return PartChecksums::File{name_, size_, hasher_.digest()};
  }

  // Like finish(), but the fsync is left to `syncs`, which takes the open file.
  Result<PartChecksums::File> finishDeferringSync(class DeferredSyncs& syncs);

  std::string& memory() { return memory_; }

 private:
  FileWriter(std::string name, Fd fd) : name_(std::move(name)), fd_(std::move(fd)) {}

  std::string name_;
  Fd fd_;
  bool in_memory_ = false;
  std::string memory_;
  Hasher128 hasher_;
  uint64_t size_ = 0;
};

// Files written but not yet fsynced. Syncing a part's files once all are written, and all at the
// same time, lets the file system commit them in fewer journal transactions than a sync per file
// right after each write (measured on ext4: a one-row part of eight files 25-45% faster than
// syncing them one after another, and every acknowledged insert waits for it).
class DeferredSyncs {
 public:
  void add(std::string name, Fd fd) { files_.emplace_back(std::move(name), std::move(fd)); }
  Status syncAll(const fs::path& dir) {
    auto syncOne = [](Fd& fd) -> Status {
      Status done = fsyncFd(fd);
      if (done) done = fd.close();
      return done;
    };
    std::vector<std::future<Status>> others;
    for (std::size_t i = 1; i < files_.size(); ++i) {
      others.push_back(std::async(std::launch::async, syncOne, std::ref(files_[i].second)));
    }
    std::vector<Status> done;
    if (!files_.empty()) done.push_back(syncOne(files_[0].second));
    for (auto& other : others) done.push_back(other.get());
    for (std::size_t i = 0; i < done.size(); ++i) {
      if (!done[i]) return std::unexpected(fileError(dir, files_[i].first, done[i].error()));
    }
    files_.clear();
    return {};
  }
  // For files whose fsync is someone else's (the part journal's): close(2)'s errors still count.
  Status closeAll(const fs::path& dir) {
    for (auto& [name, fd] : files_) {
      if (auto closed = fd.close(); !closed)
        return std::unexpected(fileError(dir, name, closed.error()));
    }
    files_.clear();
    return {};
  }

 private:
  std::vector<std::pair<std::string, Fd>> files_;
};

Result<PartChecksums::File> FileWriter::finishDeferringSync(DeferredSyncs& syncs) {
  if (in_memory_) return finish();
  syncs.add(name_, std::move(fd_));
  return PartChecksums::File{name_, size_, hasher_.digest()};
}

// Reads a file (or a PartImage's file) front to back, hashing every byte it hands out.
class FileReader {
 public:
  static Result<FileReader> open(const fs::path& path) {
    auto fd = openFd(path, O_RDONLY);
    if (!fd) return std::unexpected(fd.error());
    return FileReader(std::move(*fd));
  }
  static FileReader inMemory(std::string_view bytes) {
    FileReader reader{Fd()};
    reader.memory_ = bytes;
    return reader;
  }

  // Up to `size` bytes; fewer only at the end of the file.
  Result<std::size_t> read(void* data, std::size_t size) {
    char* p = static_cast<char*>(data);
    std::size_t done = 0;
    if (memory_) {
      done = std::min(size, memory_->size());
      if (done > 0) std::memcpy(p, memory_->data(), done);
      memory_->remove_prefix(done);
    }
    while (!memory_ && done < size) {
      const ssize_t n = ::read(fd_.get(), p + done, size - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::unexpected(fmt::format("read failed: {}", errnoText(errno)));
      if (n == 0) break;
      done += static_cast<std::size_t>(n);
    }
    hasher_.update(p, done);
    bytes_read_ += done;
    return done;
  }

  // Reads the rest, so that size and hash cover the whole file.
  Status drain() {
    std::string chunk(kReadChunkBytes, '\0');
    for (;;) {
      auto n = read(chunk.data(), chunk.size());
      if (!n) return std::unexpected(n.error());
      if (*n < chunk.size()) return {};
    }
  }

  uint64_t bytesRead() const { return bytes_read_; }
  Hash128 digest() const { return hasher_.digest(); }

 private:
  explicit FileReader(Fd fd) : fd_(std::move(fd)) {}

  Fd fd_;
  std::optional<std::string_view> memory_;  // the rest of an in-memory file
  Hasher128 hasher_;
  uint64_t bytes_read_ = 0;
};

// Where a part's files are read from: its directory, or an image in memory (`dir` then names the
// part in errors).
struct PartSource {
  explicit PartSource(const fs::path& dir, const PartImage* image = nullptr)
      : dir(dir), image(image) {}
  const fs::path& dir;
  const PartImage* image;

  Result<FileReader> open(std::string_view name) const {
    if (!image) return FileReader::open(dir / name);
    const PartFile* file = image->find(name);
    if (!file) return std::unexpected(std::string("not in the part"));
    return FileReader::inMemory(file->bytes);
  }
};

// Why a file's size or hash differs from its checksums.txt entry; nullopt if it does not.
std::optional<std::string> checksumMismatch(const PartChecksums::File& expected, uint64_t size,
                                            const Hash128& hash) {
  if (size != expected.size) {
    return fmt::format("size {} bytes, checksums.txt says {}", size, expected.size);
  }
  if (hash != expected.hash) {
    return fmt::format("hash {}, checksums.txt says {} (the content is corrupt)", hash.hex(),
                       expected.hash.hex());
  }
  return std::nullopt;
}

// A small text file in full, checked against `expected` when given. Errors: file and reason.
Result<std::string> readTextFile(const PartSource& source, std::string_view name,
                                 const PartChecksums::File* expected) {
  const fs::path& part_dir = source.dir;
  auto reader = source.open(name);
  if (!reader) return std::unexpected(fileError(part_dir, name, reader.error()));
  std::string text;
  for (;;) {
    const std::size_t old_size = text.size();
    text.resize(old_size + kReadChunkBytes);
    auto n = reader->read(text.data() + old_size, kReadChunkBytes);
    if (!n) return std::unexpected(fileError(part_dir, name, n.error()));
    text.resize(old_size + *n);
    if (text.size() > kMaxTextFileBytes) {
      return std::unexpected(
          fileError(part_dir, name, fmt::format("larger than {} bytes", kMaxTextFileBytes)));
    }
    if (*n < kReadChunkBytes) break;
  }
  if (expected) {
    if (auto why = checksumMismatch(*expected, reader->bytesRead(), reader->digest())) {
      return std::unexpected(fileError(part_dir, name, *why));
    }
  }
  return text;
}

// --- Compressed column streams ---------------------------------------------------------------

struct ZstdFree {
  void operator()(ZSTD_CCtx* context) const { ZSTD_freeCCtx(context); }
  void operator()(ZSTD_DCtx* context) const { ZSTD_freeDCtx(context); }
};
using CompressContext = std::unique_ptr<ZSTD_CCtx, ZstdFree>;
using DecompressContext = std::unique_ptr<ZSTD_DCtx, ZstdFree>;

Result<CompressContext> makeCompressContext() {
  CompressContext context(ZSTD_createCCtx());
  if (!context) return std::unexpected("zstd: cannot allocate a compression context");
  // Single-threaded (nbWorkers 0) and a fixed level: the output depends only on the input.
  for (auto [parameter, value] :
       {std::pair{ZSTD_c_compressionLevel, kZstdLevel}, std::pair{ZSTD_c_nbWorkers, 0},
        std::pair{ZSTD_c_checksumFlag, 0}}) {
    const std::size_t rc = ZSTD_CCtx_setParameter(context.get(), parameter, value);
    if (ZSTD_isError(rc)) return std::unexpected(fmt::format("zstd: {}", ZSTD_getErrorName(rc)));
  }
  return context;
}

// Contexts are kept per thread: making one for every part cost more than compressing a one-row
// part. Only single-shot calls use them (ZSTD_compress2, ZSTD_decompressDCtx), so nothing of one
// part carries over into the next, and the bytes are the same as with a fresh context.
Result<ZSTD_CCtx*> threadCompressContext() {
  thread_local CompressContext context;
  if (!context) {
    auto made = makeCompressContext();
    if (!made) return std::unexpected(made.error());
    context = std::move(*made);
  }
  return context.get();
}

Result<ZSTD_DCtx*> threadDecompressContext() {
  thread_local DecompressContext context(ZSTD_createDCtx());
  if (!context)
    return std::unexpected(std::string("zstd: cannot allocate a decompression context"));
  return context.get();
}

void putU32(char* out, uint32_t value) {
  std::memcpy(out, &value, sizeof(value));
}
uint32_t getU32(const char* in) {
  uint32_t value;
  std::memcpy(&value, in, sizeof(value));
  return value;
}

// Buffers a column's serialized bytes and writes them as compressed blocks of kBlockBytes.
class CompressedWriter {
 public:
  CompressedWriter(FileWriter& out, ZSTD_CCtx* context) : out_(out), context_(context) {
    pending_.reserve(kBlockBytes);
  }

  Status write(const void* data, std::size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
      const std::size_t n = std::min(size, kBlockBytes - pending_.size());
      pending_.append(p, n);
      p += n;
      size -= n;
      if (pending_.size() == kBlockBytes) {
        if (auto flushed = flush(); !flushed) return flushed;
      }
    }
    return {};
  }

  Status writeVarUInt(uint64_t value) {
    char bytes[10];
    std::size_t n = 0;
    do {
      bytes[n++] = static_cast<char>((value & 0x7f) | (value > 0x7f ? 0x80 : 0));
      value >>= 7;
    } while (value != 0);
    return write(bytes, n);
  }

  Status finish() { return pending_.empty() ? Status{} : flush(); }

 private:
  Status flush() {
    compressed_.resize(kBlockHeaderBytes + ZSTD_compressBound(pending_.size()));
    const std::size_t n =
        ZSTD_compress2(context_, compressed_.data() + kBlockHeaderBytes,
                       compressed_.size() - kBlockHeaderBytes, pending_.data(), pending_.size());
    if (ZSTD_isError(n)) return std::unexpected(fmt::format("zstd: {}", ZSTD_getErrorName(n)));
    compressed_[0] = static_cast<char>(kMethodZstd);
    putU32(&compressed_[1], static_cast<uint32_t>(n));
    putU32(&compressed_[5], static_cast<uint32_t>(pending_.size()));
    pending_.clear();
    return out_.write(compressed_.data(), kBlockHeaderBytes + n);
  }

  FileWriter& out_;
  ZSTD_CCtx* context_;
  std::string pending_;
  std::string compressed_;
};

// The uncompressed byte stream of a column file, one block in memory at a time. Every length in
// a header is checked before it sizes a buffer, so a corrupt file cannot ask for much memory.
class CompressedReader {
 public:
  CompressedReader(FileReader& in, ZSTD_DCtx* context) : in_(in), context_(context) {}

  // Exactly `size` bytes into `data`, or past them when `data` is null.
  Status read(void* data, std::size_t size) {
    char* p = static_cast<char*>(data);
    while (size > 0) {
      if (position_ == block_.size()) {
        auto more = nextBlock();
        if (!more) return std::unexpected(more.error());
        if (!*more) {
          return std::unexpected(fmt::format(
              "data ends after {} uncompressed bytes, {} more expected", consumed(), size));
        }
      }
      const std::size_t n = std::min(size, block_.size() - position_);
      if (p) {
        std::memcpy(p, block_.data() + position_, n);
        p += n;
      }
      position_ += n;
      size -= n;
    }
    return {};
  }

  Result<uint64_t> readVarUInt() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (auto ok = read(&byte, 1); !ok) return std::unexpected(ok.error());
      value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return std::unexpected(
        fmt::format("a length at uncompressed byte {} is longer than 10 bytes", consumed()));
  }

  Result<bool> atEnd() {
    if (position_ < block_.size()) return false;
    auto more = nextBlock();
    if (!more) return std::unexpected(more.error());
    return !*more;
  }

  uint64_t consumed() const { return consumed_before_block_ + position_; }

 private:
  // False at a clean end of file.
  Result<bool> nextBlock() {
    consumed_before_block_ += block_.size();
    block_.clear();
    position_ = 0;
    const uint64_t offset = in_.bytesRead();
    char header[kBlockHeaderBytes];
    auto n = in_.read(header, sizeof(header));
    if (!n) return std::unexpected(n.error());
    if (*n == 0) return false;
    if (*n < sizeof(header)) {
      return std::unexpected(fmt::format("block header at byte {} is cut short", offset));
    }
    const uint32_t compressed_size = getU32(header + 1);
    const uint32_t uncompressed_size = getU32(header + 5);
    if (static_cast<uint8_t>(header[0]) != kMethodZstd) {
      return std::unexpected(fmt::format("block at byte {}: unknown compression method 0x{:02x}",
                                         offset, static_cast<uint8_t>(header[0])));
    }
    if (uncompressed_size == 0 || uncompressed_size > kBlockBytes || compressed_size == 0 ||
        compressed_size > ZSTD_compressBound(kBlockBytes)) {
      return std::unexpected(fmt::format("block at byte {}: sizes {} -> {} are out of range",
                                         offset, compressed_size, uncompressed_size));
    }
    compressed_.resize(compressed_size);
    n = in_.read(compressed_.data(), compressed_size);
    if (!n) return std::unexpected(n.error());
    if (*n < compressed_size) {
      return std::unexpected(fmt::format("block at byte {} is cut short: {} of {} bytes", offset,
                                         *n, compressed_size));
    }
    block_.resize(uncompressed_size);
    const std::size_t got = ZSTD_decompressDCtx(context_, block_.data(), block_.size(),
                                                compressed_.data(), compressed_.size());
    if (ZSTD_isError(got) || got != uncompressed_size) {
      return std::unexpected(fmt::format(
          "block at byte {} does not decompress to its {} bytes: {}", offset, uncompressed_size,
          ZSTD_isError(got) ? ZSTD_getErrorName(got) : fmt::format("got {}", got)));
    }
    return true;
  }

  FileReader& in_;
  ZSTD_DCtx* context_;
  std::string compressed_;
  std::string block_;
  std::size_t position_ = 0;
  uint64_t consumed_before_block_ = 0;
};

// --- Column serialization --------------------------------------------------------------------

std::string columnFileName(std::string_view column) {
  return fmt::format("{}.bin", column);
}

// Nullable: the null map (a byte per row) first. Then the values: fixed-width types as a raw
// little-endian array, String as (varint length, bytes) per value.
Status writeColumn(CompressedWriter& out, const Column& column) {
  if (column.type.nullable) {
    if (auto ok = out.write(column.null_map.data(), column.null_map.size()); !ok) return ok;
  }
  return std::visit(
      [&](const auto& values) -> Status {
        using T = typename std::decay_t<decltype(values)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          for (const auto& value : values) {
            if (auto ok = out.writeVarUInt(value.size()); !ok) return ok;
            if (auto ok = out.write(value.data(), value.size()); !ok) return ok;
          }
          return {};
        } else {
          return out.write(values.data(), values.size() * sizeof(T));
        }
      },
      column.values);
}

// Appends `count` items read from `in` to `items` (or walks past them when null), growing by at
// most a block at a time so that a corrupt row count cannot allocate more than the data holds.
template <class Container>
Status readArray(CompressedReader& in, uint64_t count, Container* items) {
  using T = typename Container::value_type;
  constexpr uint64_t kChunk = kBlockBytes / sizeof(T);
  while (count > 0) {
    const std::size_t n = static_cast<std::size_t>(std::min(count, kChunk));
    T* target = nullptr;
    if (items) {
      items->resize(items->size() + n);
      target = items->data() + items->size() - n;
    }
    if (auto ok = in.read(target, n * sizeof(T)); !ok) return ok;
    count -= n;
  }
  return {};
}

// Reads `rows` values of `type` into `out` (made by Column::empty), or walks past them when
// `out` is null.
Status readColumn(CompressedReader& in, const DataType& type, uint64_t rows, Column* out) {
  if (type.nullable) {
    if (auto ok = readArray(in, rows, out ? &out->null_map : nullptr); !ok) {
      return std::unexpected(fmt::format("null map: {}", ok.error()));
    }
  }
  ColumnValues scratch = emptyValuesFor(type.id);
  ColumnValues& values = out ? out->values : scratch;
  return std::visit(
      [&](auto& typed) -> Status {
        using T = typename std::decay_t<decltype(typed)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          for (uint64_t row = 0; row < rows; ++row) {
            auto size = in.readVarUInt();
            if (!size) return std::unexpected(fmt::format("row {}: {}", row, size.error()));
            std::string value;
            if (auto ok = readArray(in, *size, out ? &value : nullptr); !ok) {
              return std::unexpected(fmt::format("row {}: {}", row, ok.error()));
            }
            if (out) typed.push_back(std::move(value));
          }
          return {};
        } else {
          if (auto ok = readArray(in, rows, out ? &typed : nullptr); !ok) {
            return std::unexpected(fmt::format("values: {}", ok.error()));
          }
          return {};
        }
      },
      values);
}

// Decodes `<column>.bin` (into `out`, or only walking it) and checks it against `expected`. A
// checksum mismatch is reported before a decoding error: corruption explains the latter.
Status readColumnFile(const PartSource& source, const PartChecksums::File& expected,
                      const DataType& type, uint64_t rows, Column* out, ZSTD_DCtx* context) {
  const fs::path& part_dir = source.dir;
  auto reader = source.open(expected.name);
  if (!reader) return std::unexpected(fileError(part_dir, expected.name, reader.error()));
  CompressedReader in(*reader, context);
  Status decoded = readColumn(in, type, rows, out);
  if (decoded) {
    auto end = in.atEnd();
    if (!end) {
      decoded = std::unexpected(end.error());
    } else if (!*end) {
      decoded = std::unexpected(fmt::format("holds more than count.txt's {} rows", rows));
    }
  }
  if (!decoded) {
    if (auto drained = reader->drain(); !drained) {
      return std::unexpected(fileError(part_dir, expected.name, drained.error()));
    }
  }
  if (auto why = checksumMismatch(expected, reader->bytesRead(), reader->digest())) {
    return std::unexpected(fileError(part_dir, expected.name, *why));
  }
  if (!decoded) {
    return std::unexpected(
        fileError(part_dir, expected.name,
                  fmt::format("{} rows of {}: {}", rows, type.name(), decoded.error())));
  }
  return {};
}

// --- Text files ------------------------------------------------------------------------------

// ClickHouse's columns.txt.
std::string columnsFileText(const TableSchema& schema) {
  std::string text =
      fmt::format("columns format version: 1\n{} columns:\n", schema.columns().size());
  for (const auto& column : schema.columns()) {
    text += fmt::format("`{}` {}\n", column.name, column.type.name());
  }
  return text;
}

std::vector<std::string_view> splitLines(std::string_view text) {
  std::vector<std::string_view> lines;
  for (std::size_t start = 0;;) {
    const std::size_t end = text.find('\n', start);
    lines.push_back(text.substr(start, end == std::string_view::npos ? end : end - start));
    if (end == std::string_view::npos) return lines;
    start = end + 1;
  }
}

// "line 3 is '`b` String', the schema has '`b` UInt64'" at the first line that differs.
std::string firstDifference(std::string_view found, std::string_view expected) {
  const auto found_lines = splitLines(found);
  const auto expected_lines = splitLines(expected);
  for (std::size_t i = 0;; ++i) {
    const bool has_found = i < found_lines.size();
    const bool has_expected = i < expected_lines.size();
    if (has_found && has_expected && found_lines[i] == expected_lines[i]) continue;
    return fmt::format("line {} is {}, the schema has {}", i + 1,
                       has_found ? quotedExcerpt(found_lines[i]) : "missing",
                       has_expected ? quotedExcerpt(expected_lines[i]) : "no such line");
  }
}

Result<uint64_t> readCount(const PartSource& source, const PartChecksums& checksums) {
  const fs::path& part_dir = source.dir;
  const auto* entry = checksums.find(kCountFile);
  if (!entry)
    return std::unexpected(fileError(part_dir, kCountFile, "not listed in checksums.txt"));
  auto text = readTextFile(source, kCountFile, entry);
  if (!text) return std::unexpected(text.error());
  auto rows = parseDecimal<uint64_t>(*text);
  if (!rows) {
    return std::unexpected(fileError(part_dir, kCountFile,
                                     fmt::format("{} is not a row count", quotedExcerpt(*text))));
  }
  return *rows;
}

Status checkColumnsFile(const PartSource& source, const PartChecksums& checksums,
                        const TableSchema& schema) {
  const fs::path& part_dir = source.dir;
  const auto* entry = checksums.find(kColumnsFile);
  if (!entry)
    return std::unexpected(fileError(part_dir, kColumnsFile, "not listed in checksums.txt"));
  auto text = readTextFile(source, kColumnsFile, entry);
  if (!text) return std::unexpected(text.error());
  const std::string expected = columnsFileText(schema);
  if (*text != expected) {
    return std::unexpected(fileError(
        part_dir, kColumnsFile,
        fmt::format("does not match the table's schema: {}", firstDifference(*text, expected))));
  }
  return {};
}

Result<PartChecksums> readChecksums(const PartSource& source) {
  const fs::path& part_dir = source.dir;
  auto text = readTextFile(source, kChecksumsFile, nullptr);
  if (!text) return std::unexpected(text.error());
  auto checksums = PartChecksums::parse(*text);
  if (!checksums) return std::unexpected(fileError(part_dir, kChecksumsFile, checksums.error()));
  return checksums;
}

// --- Writing ---------------------------------------------------------------------------------

Status checkBlockMatchesSchema(const TableSchema& schema, const Block& block) {
  const auto& specs = schema.columns();
  if (block.columns.size() != specs.size()) {
    return std::unexpected(
        fmt::format("the block has {} columns, the schema {}", block.columns.size(), specs.size()));
  }
  const std::size_t rows = block.rows();
  for (std::size_t i = 0; i < specs.size(); ++i) {
    const Column& column = block.columns[i];
    if (column.name != specs[i].name || column.type != specs[i].type ||
        column.values.index() != emptyValuesFor(specs[i].type.id).index()) {
      return std::unexpected(fmt::format("block column {} is `{}` {}, the schema has `{}` {}",
                                         i + 1, column.name, column.type.name(), specs[i].name,
                                         specs[i].type.name()));
    }
    if (column.size() != rows) {
      return std::unexpected(fmt::format("column '{}' has {} rows, column '{}' has {}", column.name,
                                         column.size(), block.columns[0].name, rows));
    }
    if (column.null_map.size() != (column.type.nullable ? rows : 0)) {
      return std::unexpected(fmt::format("column '{}' has a null map of {} entries for {} rows",
                                         column.name, column.null_map.size(), rows));
    }
  }
  return {};
}

// A small file, fsynced.
Result<PartChecksums::File> writeTextFile(const fs::path& dir, std::string_view name,
                                          std::string_view text, bool replace = false) {
  auto out = FileWriter::create(dir / name, replace);
  if (!out) return std::unexpected(fileError(dir, name, out.error()));
  if (auto ok = out->write(text.data(), text.size()); !ok) {
    return std::unexpected(fileError(dir, name, ok.error()));
  }
  auto file = out->finish();
  if (!file) return std::unexpected(fileError(dir, name, file.error()));
  return file;
}

// Encodes every file of the part, each into a writer from `open(name)` (a file or memory) that
// `done(writer)` finishes, checksums.txt last. `dir` names the part in errors.
template <class Open, class Done>
Result<PartChecksums> encodePartFiles(const fs::path& dir, const TableSchema& schema,
                                      const Block& block, Open open, Done done) {
  auto context = threadCompressContext();
  if (!context) return std::unexpected(fmt::format("part {}: {}", dir.string(), context.error()));
  auto encode = [&](std::string_view name, const auto& write) -> Result<PartChecksums::File> {
    Result<FileWriter> out = open(name);
    if (!out) return std::unexpected(fileError(dir, name, out.error()));
    Status written = write(*out);
    if (!written) return std::unexpected(fileError(dir, name, written.error()));
    Result<PartChecksums::File> file = done(*out);
    if (!file) return std::unexpected(fileError(dir, name, file.error()));
    return file;
  };
  auto text = [](std::string value) {
    return [value = std::move(value)](FileWriter& out) {
      return out.write(value.data(), value.size());
    };
  };
  // A column's file, compressed, left for `done` to finish.
  auto encodeColumn = [&](const Column& column, ZSTD_CCtx* compress) -> Result<FileWriter> {
    const std::string name = columnFileName(column.name);
    Result<FileWriter> out = open(name);
    if (!out) return std::unexpected(fileError(dir, name, out.error()));
    Status written;
    {
      CompressedWriter compressed(*out, compress);
      written = writeColumn(compressed, column);
      if (written) written = compressed.finish();
    }
    if (!written) return std::unexpected(fileError(dir, name, written.error()));
    return out;
  };
  std::vector<std::optional<Result<FileWriter>>> encoded(block.columns.size());
  // A big part's columns are compressed on every core, each column a file of its own (a bulk
  // insert's part would otherwise be written by one thread while the others wait for it).
  static const std::size_t kCores = std::max(1u, std::thread::hardware_concurrency());
  constexpr std::size_t kParallelRows = 100'000;
  const std::size_t helpers =
      block.rows() >= kParallelRows ? std::min(kCores, block.columns.size()) - 1 : 0;
  std::atomic<std::size_t> next_column{0};
  auto encodeColumns = [&](ZSTD_CCtx* compress) {
    for (std::size_t i; (i = next_column.fetch_add(1)) < block.columns.size();)
      encoded[i] = encodeColumn(block.columns[i], compress);
  };
  std::vector<std::future<Status>> helping;
  for (std::size_t h = 0; h < helpers; ++h) {
    helping.push_back(std::async(std::launch::async, [&]() -> Status {
      auto own = threadCompressContext();
      if (!own) return std::unexpected(own.error());
      encodeColumns(*own);
      return {};
    }));
  }
  encodeColumns(*context);
  for (auto& helper : helping) {
    if (auto ok = helper.get(); !ok)
      return std::unexpected(fmt::format("part {}: {}", dir.string(), ok.error()));
  }
  std::vector<PartChecksums::File> files;
  for (std::size_t i = 0; i < block.columns.size(); ++i) {
    if (!*encoded[i]) return std::unexpected(encoded[i]->error());
    Result<PartChecksums::File> file = done(**encoded[i]);
    if (!file)
      return std::unexpected(fileError(dir, columnFileName(block.columns[i].name), file.error()));
    files.push_back(std::move(*file));
  }
  for (auto [name, value] : {std::pair{kColumnsFile, columnsFileText(schema)},
                             std::pair{kCountFile, fmt::format("{}", block.rows())}}) {
    auto file = encode(name, text(std::move(value)));
    if (!file) return std::unexpected(file.error());
    files.push_back(std::move(*file));
  }
  PartChecksums checksums = PartChecksums::fromFiles(std::move(files));
  if (auto file = encode(kChecksumsFile, text(checksums.format())); !file)
    return std::unexpected(file.error());
  return checksums;
}

// Every file of the part into `dir` (which exists and is empty), all fsynced at the end unless
// `sync` is kLater.
Result<PartChecksums> writePartFiles(const fs::path& dir, const TableSchema& schema,
                                     const Block& block, PartSync sync = PartSync::kNow) {
  DeferredSyncs syncs;
  auto checksums = encodePartFiles(
      dir, schema, block, [&](std::string_view name) { return FileWriter::create(dir / name); },
      [&](FileWriter& out) { return out.finishDeferringSync(syncs); });
  if (!checksums) return checksums;
  Status done = sync == PartSync::kNow ? syncs.syncAll(dir) : syncs.closeAll(dir);
  if (!done) return std::unexpected(done.error());
  return checksums;
}

// --- Loading ---------------------------------------------------------------------------------

// Moves `table_dir/name` to `detached/broken_<name>` (or `..._tryN` if that exists) and writes
// `reason.txt` into it.
Status moveToDetached(const fs::path& table_dir, const std::string& name,
                      const std::string& reason) {
  const fs::path detached = table_dir / kDetachedDir;
  std::error_code ec;
  fs::create_directory(detached, ec);
  if (ec)
    return std::unexpected(fmt::format("cannot create {}: {}", detached.string(), ec.message()));
  // ClickHouse's tryN suffixes: a part of the same name may have broken before.
  constexpr int kMaxTries = 1000;
  for (int attempt = 0; attempt < kMaxTries; ++attempt) {
    std::string target_name = fmt::format("{}{}", kBrokenPrefix, name);
    if (attempt > 0) target_name += fmt::format("_try{}", attempt);
    const fs::path target = detached / target_name;
    if (fs::exists(target, ec)) continue;
    if (auto moved = renameNoReplace(table_dir / name, target); !moved) return moved;
    auto written = writeTextFile(target, kReasonFile, reason + "\n", /*replace=*/true);
    if (!written) return std::unexpected(written.error());
    if (auto synced = fsyncDirectory(detached); !synced) return synced;
    return fsyncDirectory(table_dir);
  }
  return std::unexpected(fmt::format("cannot move part {} aside: {} broken copies exist in {}",
                                     name, kMaxTries, detached.string()));
}

}  // namespace

// --- PartChecksums ---------------------------------------------------------------------------

PartChecksums PartChecksums::fromFiles(std::vector<File> files) {
  std::sort(files.begin(), files.end(),
            [](const File& a, const File& b) { return a.name < b.name; });
  PartChecksums checksums;
  checksums.total = totalOf(files);
  checksums.files = std::move(files);
  return checksums;
}

Hash128 PartChecksums::totalOf(const std::vector<File>& files) {
  Hasher128 hasher;
  for (const File& file : files) {
    hasher.updateString(file.name);
    hasher.updateU64(file.size);
    hasher.updateU64(file.hash.high);
    hasher.updateU64(file.hash.low);
  }
  return hasher.digest();
}

const PartChecksums::File* PartChecksums::find(std::string_view name) const {
  auto it = std::lower_bound(files.begin(), files.end(), name,
                             [](const File& file, std::string_view n) { return file.name < n; });
  return it != files.end() && it->name == name ? &*it : nullptr;
}

std::string PartChecksums::format() const {
  std::string text = fmt::format("{}\n{} files:\n", kChecksumsHeader, files.size());
  for (const File& file : files) {
    text += fmt::format("{}\t{}\t{}\n", file.name, file.size, file.hash.hex());
  }
  text += fmt::format("total: {}\n", total.hex());
  return text;
}

std::expected<PartChecksums, std::string> PartChecksums::parse(std::string_view text) {
  std::vector<std::string_view> lines = splitLines(text);
  // A final newline leaves an empty last element; without it the last line is cut short.
  if (lines.back().empty()) {
    lines.pop_back();
  } else {
    return std::unexpected(fmt::format("line {}: no newline at the end", lines.size()));
  }
  std::size_t next = 0;
  auto fail = [&](std::string_view what) {
    return std::unexpected(fmt::format("line {}: {}", next, what));
  };
  auto nextLine = [&]() -> std::optional<std::string_view> {
    if (next == lines.size()) {
      ++next;
      return std::nullopt;
    }
    return lines[next++];
  };
  auto header = nextLine();
  if (header != kChecksumsHeader) {
    return fail(fmt::format("expected '{}', found {}", kChecksumsHeader,
                            header ? quotedExcerpt(*header) : "the end of the file"));
  }
  auto count_line = nextLine();
  std::optional<uint64_t> count;
  if (count_line && count_line->ends_with(" files:")) {
    count = parseDecimal<uint64_t>(count_line->substr(0, count_line->size() - 7));
  }
  if (!count) {
    return fail(fmt::format("expected '<N> files:', found {}",
                            count_line ? quotedExcerpt(*count_line) : "the end of the file"));
  }
  PartChecksums checksums;
  for (uint64_t i = 0; i < *count; ++i) {
    auto line = nextLine();
    if (!line) return fail(fmt::format("the file ends after {} of {} files", i, *count));
    const std::size_t tab1 = line->find('\t');
    const std::size_t tab2 = tab1 == std::string_view::npos ? tab1 : line->find('\t', tab1 + 1);
    std::optional<uint64_t> size;
    std::optional<Hash128> hash;
    std::string_view name;
    if (tab2 != std::string_view::npos) {
      name = line->substr(0, tab1);
      size = parseDecimal<uint64_t>(line->substr(tab1 + 1, tab2 - tab1 - 1));
      hash = Hash128::fromHex(line->substr(tab2 + 1));
    }
    if (!size || !hash) {
      return fail(fmt::format("expected '<name>\\t<size>\\t<32 hex digits>', found {}",
                              quotedExcerpt(*line)));
    }
    if (name.empty() || name == "." || name == ".." ||
        name.find_first_of(std::string_view("/\0", 2)) != std::string_view::npos) {
      return fail(fmt::format("{} is not a file name", quotedExcerpt(name)));
    }
    if (!checksums.files.empty() && name <= checksums.files.back().name) {
      return fail(fmt::format("file {} is not after {} (names are sorted and unique)",
                              quotedExcerpt(name), quotedExcerpt(checksums.files.back().name)));
    }
    checksums.files.push_back(File{std::string(name), *size, *hash});
  }
  auto total_line = nextLine();
  std::optional<Hash128> total;
  if (total_line && total_line->starts_with("total: "))
    total = Hash128::fromHex(total_line->substr(7));
  if (!total) {
    return fail(fmt::format("expected 'total: <32 hex digits>', found {}",
                            total_line ? quotedExcerpt(*total_line) : "the end of the file"));
  }
  checksums.total = totalOf(checksums.files);
  if (*total != checksums.total) {
    return fail(fmt::format("total {} does not match the files listed, whose total is {}",
                            total->hex(), checksums.total.hex()));
  }
  if (next != lines.size()) {
    ++next;
    return fail(fmt::format("unexpected text after the total: {}", quotedExcerpt(lines[next - 1])));
  }
  return checksums;
}

// --- Parts -----------------------------------------------------------------------------------

std::expected<PartChecksums, std::string> writePart(const fs::path& table_dir, const PartName& name,
                                                    const TableSchema& schema, const Block& block) {
  const std::string part_name = name.format();
  const fs::path part_dir = table_dir / part_name;
  const fs::path tmp_dir = table_dir / fmt::format("{}{}", kTemporaryPrefix, part_name);
  if (auto matches = checkBlockMatchesSchema(schema, block); !matches) {
    return std::unexpected(fmt::format("part {}: {}", part_dir.string(), matches.error()));
  }
  std::error_code ec;
  const bool exists = fs::exists(part_dir, ec);
  if (ec || exists) {
    return std::unexpected(
        fmt::format("part {}: {}", part_dir.string(), ec ? ec.message() : "already exists"));
  }
  // mkdir is the lock among writers of one part name.
  auto made = makeDirectory(tmp_dir);
  if (!made || !*made) {
    return std::unexpected(fmt::format(
        "part {}: {}", part_dir.string(),
        !made ? made.error()
              : fmt::format("cannot create {}: it exists (a write of this part is running, or a "
                            "crash left it: loadParts removes it)",
                            tmp_dir.string())));
  }
  auto fail = [&](std::string error) {
    fs::remove_all(tmp_dir, ec);
    return std::unexpected(std::move(error));
  };
  auto checksums = writePartFiles(tmp_dir, schema, block);
  if (!checksums) return fail(checksums.error());
  if (auto synced = fsyncDirectory(tmp_dir); !synced) {
    return fail(fmt::format("part {}: {}", part_dir.string(), synced.error()));
  }
  if (auto renamed = renameNoReplace(tmp_dir, part_dir); !renamed) {
    return fail(fmt::format("part {}: {}", part_dir.string(), renamed.error()));
  }
  if (auto synced = fsyncDirectory(table_dir); !synced) {
    // The rename may or may not survive a crash; a part reported as not written must not stay.
    fs::remove_all(part_dir, ec);
    return std::unexpected(fmt::format("part {}: {}", part_dir.string(), synced.error()));
  }
  return checksums;
}

std::expected<PartChecksums, std::string> writeStagedPart(const fs::path& dir,
                                                          const TableSchema& schema,
                                                          const Block& block, PartSync sync) {
  if (auto matches = checkBlockMatchesSchema(schema, block); !matches) {
    return std::unexpected(fmt::format("part {}: {}", dir.string(), matches.error()));
  }
  std::error_code ec;
  if (auto made = makeDirectory(dir); !made || !*made) {
    return std::unexpected(fmt::format("part {}: cannot create it: {}", dir.string(),
                                       made ? "it exists" : made.error()));
  }
  auto checksums = writePartFiles(dir, schema, block, sync);
  if (checksums && sync == PartSync::kNow) {
    if (auto synced = fsyncDirectory(dir); !synced) {
      checksums = std::unexpected(fmt::format("part {}: {}", dir.string(), synced.error()));
    }
  }
  if (!checksums) fs::remove_all(dir, ec);
  return checksums;
}

const PartFile* PartImage::find(std::string_view name) const {
  auto it = std::ranges::find(files, name, &PartFile::name);
  return it == files.end() ? nullptr : &*it;
}

uint64_t PartImage::bytes() const {
  uint64_t total = 0;
  for (const auto& file : files) total += file.bytes.size();
  return total;
}

std::expected<PartImage, std::string> encodePart(const TableSchema& schema, const Block& block) {
  static const fs::path kInMemory("(part in memory)");
  if (auto matches = checkBlockMatchesSchema(schema, block); !matches) {
    return std::unexpected(fmt::format("part {}: {}", kInMemory.string(), matches.error()));
  }
  PartImage image;
  auto checksums = encodePartFiles(
      kInMemory, schema, block,
      [](std::string_view name) {
        return Result<FileWriter>(FileWriter::inMemory(std::string(name)));
      },
      [&](FileWriter& out) {
        auto file = out.finish();
        if (file) image.files.push_back(PartFile{file->name, std::move(out.memory())});
        return file;
      });
  if (!checksums) return std::unexpected(checksums.error());
  image.checksums = std::move(*checksums);
  return image;
}

std::expected<void, std::string> writePartImage(const fs::path& dir,
                                                const std::vector<PartFile>& files, PartSync sync) {
  std::error_code ec;
  if (auto made = makeDirectory(dir); !made || !*made) {
    return std::unexpected(fmt::format("part {}: cannot create it: {}", dir.string(),
                                       made ? "it exists" : made.error()));
  }
  auto fail = [&](std::string error) {
    fs::remove_all(dir, ec);
    return std::unexpected(std::move(error));
  };
  DeferredSyncs syncs;
  for (const auto& file : files) {
    auto out = FileWriter::create(dir / file.name);
    if (!out) return fail(fileError(dir, file.name, out.error()));
    if (auto ok = out->write(file.bytes.data(), file.bytes.size()); !ok)
      return fail(fileError(dir, file.name, ok.error()));
    if (auto ok = out->finishDeferringSync(syncs); !ok)
      return fail(fileError(dir, file.name, ok.error()));
  }
  if (Status done = sync == PartSync::kNow ? syncs.syncAll(dir) : syncs.closeAll(dir); !done)
    return fail(done.error());
  if (sync == PartSync::kNow) {
    if (auto synced = fsyncDirectory(dir); !synced)
      return fail(fmt::format("part {}: {}", dir.string(), synced.error()));
  }
  return {};
}

std::expected<void, std::string> syncPartFiles(const fs::path& dir,
                                               const PartChecksums& checksums) {
  DeferredSyncs syncs;
  std::vector<std::string_view> names{kChecksumsFile};
  for (const auto& file : checksums.files) names.push_back(file.name);
  for (std::string_view name : names) {
    auto fd = openFd(dir / name, O_RDONLY);
    if (!fd) return std::unexpected(fileError(dir, name, fd.error()));
    syncs.add(std::string(name), std::move(*fd));
  }
  if (auto synced = syncs.syncAll(dir); !synced) return synced;
  if (auto synced = fsyncDirectory(dir); !synced) {
    return std::unexpected(fmt::format("part {}: {}", dir.string(), synced.error()));
  }
  return {};
}

namespace {

Result<Block> readPartFrom(const PartSource& source, const TableSchema& schema) {
  const fs::path& part_dir = source.dir;
  auto checksums = readChecksums(source);
  if (!checksums) return std::unexpected(checksums.error());
  if (auto ok = checkColumnsFile(source, *checksums, schema); !ok) {
    return std::unexpected(ok.error());
  }
  auto rows = readCount(source, *checksums);
  if (!rows) return std::unexpected(rows.error());
  auto context = threadDecompressContext();
  if (!context) return std::unexpected(context.error());
  Block block;
  for (const ColumnSpec& spec : schema.columns()) {
    const std::string name = columnFileName(spec.name);
    const auto* entry = checksums->find(name);
    if (!entry) return std::unexpected(fileError(part_dir, name, "not listed in checksums.txt"));
    Column column = Column::empty(spec.name, spec.type);
    if (auto ok = readColumnFile(source, *entry, spec.type, *rows, &column, *context); !ok) {
      return std::unexpected(ok.error());
    }
    block.columns.push_back(std::move(column));
  }
  return block;
}

}  // namespace

std::expected<Block, std::string> readPart(const fs::path& part_dir, const TableSchema& schema) {
  return readPartFrom(PartSource(part_dir), schema);
}

std::expected<Block, std::string> readPart(const PartImage& image, const TableSchema& schema,
                                           const fs::path& name_for_errors) {
  return readPartFrom(PartSource(name_for_errors, &image), schema);
}

std::expected<PartChecksums, std::string> verifyPart(const fs::path& part_dir,
                                                     const TableSchema& schema) {
  const PartSource source(part_dir);
  auto checksums = readChecksums(source);
  if (!checksums) return std::unexpected(checksums.error());

  std::set<std::string, std::less<>> expected = {std::string(kColumnsFile),
                                                 std::string(kCountFile)};
  for (const auto& spec : schema.columns()) expected.insert(columnFileName(spec.name));
  for (const auto& name : expected) {
    if (!checksums->find(name)) {
      return std::unexpected(fileError(part_dir, name, "not listed in checksums.txt"));
    }
  }
  for (const auto& file : checksums->files) {
    if (!expected.contains(file.name)) {
      return std::unexpected(fileError(
          part_dir, file.name, "listed in checksums.txt, but no file of this table's parts"));
    }
  }

  // What is there, sorted so that the first problem reported does not depend on readdir order.
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(part_dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(*it);
  }
  if (ec) {
    return std::unexpected(
        fmt::format("part {}: cannot list: {}", part_dir.string(), ec.message()));
  }
  std::sort(entries.begin(), entries.end());
  std::set<std::string, std::less<>> present;
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name == kChecksumsFile) continue;
    const auto* listed = checksums->find(name);
    if (!listed) return std::unexpected(fileError(part_dir, name, "not listed in checksums.txt"));
    if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) {
      return std::unexpected(fileError(part_dir, name, "not a regular file"));
    }
    const uint64_t size = entry.file_size(ec);
    if (ec) return std::unexpected(fileError(part_dir, name, ec.message()));
    if (size != listed->size) {
      return std::unexpected(fileError(
          part_dir, name, fmt::format("size {} bytes, checksums.txt says {}", size, listed->size)));
    }
    present.insert(name);
  }
  for (const auto& file : checksums->files) {
    if (!present.contains(file.name)) {
      return std::unexpected(fileError(
          part_dir, file.name, fmt::format("missing (checksums.txt lists {} bytes)", file.size)));
    }
  }

  if (auto ok = checkColumnsFile(source, *checksums, schema); !ok) {
    return std::unexpected(ok.error());
  }
  auto rows = readCount(source, *checksums);
  if (!rows) return std::unexpected(rows.error());
  auto context = threadDecompressContext();
  if (!context) return std::unexpected(context.error());
  for (const ColumnSpec& spec : schema.columns()) {
    const auto* entry = checksums->find(columnFileName(spec.name));
    if (auto ok = readColumnFile(source, *entry, spec.type, *rows, nullptr, *context); !ok) {
      return std::unexpected(ok.error());
    }
  }
  return checksums;
}

std::expected<LoadedParts, std::string> loadParts(const fs::path& table_dir,
                                                  const TableSchema& schema) {
  std::error_code ec;
  std::vector<fs::directory_entry> entries;
  for (fs::directory_iterator it(table_dir, ec), end; !ec && it != end; it.increment(ec)) {
    entries.push_back(*it);
  }
  if (ec)
    return std::unexpected(fmt::format("table directory {}: {}", table_dir.string(), ec.message()));
  std::sort(entries.begin(), entries.end());

  LoadedParts loaded;
  bool removed_any = false;
  for (const auto& entry : entries) {
    const std::string name = entry.path().filename().string();
    // A later generation's directory (table_paths.h): that generation's own store loads it.
    if (name == kDetachedDir || name.starts_with(kGenerationDirPrefix)) continue;
    if (name.starts_with(kTemporaryPrefix)) {
      fs::remove_all(entry.path(), ec);
      if (ec) {
        return std::unexpected(
            fmt::format("cannot remove {}: {}", entry.path().string(), ec.message()));
      }
      loaded.removed_temporary.push_back(name);
      removed_any = true;
      continue;
    }
    auto part = PartName::parse(name);
    if (!part) {
      loaded.ignored.emplace_back(name, part.error());
      continue;
    }
    if (part->format() != name) {
      loaded.ignored.emplace_back(
          name, fmt::format("not a part name as written (that would be '{}')", part->format()));
      continue;
    }
    if (!entry.is_directory(ec) || entry.is_symlink(ec)) {
      loaded.ignored.emplace_back(name, "a part name, but not a directory");
      continue;
    }
    auto checksums = verifyPart(entry.path(), schema);
    if (checksums) {
      loaded.valid.emplace_back(std::move(*part), std::move(*checksums));
      continue;
    }
    if (auto moved = moveToDetached(table_dir, name, checksums.error()); !moved) {
      return std::unexpected(
          fmt::format("broken part {} ({}): {}", name, checksums.error(), moved.error()));
    }
    loaded.broken.emplace_back(name, checksums.error());
  }
  if (removed_any) {
    if (auto synced = fsyncDirectory(table_dir); !synced) return std::unexpected(synced.error());
  }
  std::sort(loaded.valid.begin(), loaded.valid.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return loaded;
}

}  // namespace rtable::core
