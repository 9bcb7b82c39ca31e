#include "rtable/replication_core/part_journal.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>

#include "posix_file.h"
#include "rtable/replication_core/hash128.h"

namespace rtable::core {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kMagic = "RTJ1";
constexpr std::size_t kHeaderBytes = 4 + 4 + 16;
constexpr std::string_view kFilePrefix = "journal-";
constexpr std::string_view kFileSuffix = ".bin";
// The next journal file, zero-filled and synced ahead of time by the background (prepareSpare):
// an append that overwrites zeros needs no inode update in its fdatasync. Measured with 700-byte
// appends: 0.32 against 0.55 ms per append+fdatasync on a journaled ext4, 0.18 against 0.24 ms on
// one without a journal. The size holds about 5 s of single-row inserts; past it, appends extend
// the file as before.
constexpr std::string_view kSpareName = "journal-spare.tmp";
constexpr uint64_t kSpareBytes = 4 << 20;
// Parts a journal restores are small; a record claiming more is damage, not a part.
constexpr uint32_t kMaxRecordBytes = 256u << 20;

template <typename T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (part_format.cpp asserts it)
  out.append(bytes, sizeof(T));
}

// Reads fixed-width values and strings off the front of a payload; false once it runs short.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : rest_(bytes) {}
  template <typename T>
  bool get(T* value) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(value, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return true;
  }
  bool get(std::size_t size, std::string* out) {
    if (rest_.size() < size) return false;
    out->assign(rest_.substr(0, size));
    rest_.remove_prefix(size);
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

// A record's names become paths: one plain component each.
bool plainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::optional<JournaledPart> decodePayload(std::string_view payload) {
  Cursor in(payload);
  JournaledPart part;
  uint16_t name_size = 0;
  uint32_t files = 0;
  if (!in.get(&name_size) || !in.get(name_size, &part.name) || !plainName(part.name))
    return std::nullopt;
  if (!in.get(&files)) return std::nullopt;
  for (uint32_t i = 0; i < files; ++i) {
    JournaledPart::File file;
    uint64_t size = 0;
    if (!in.get(&name_size) || !in.get(name_size, &file.name) || !plainName(file.name))
      return std::nullopt;
    if (!in.get(&size) || !in.get(size, &file.bytes)) return std::nullopt;
    part.files.push_back(std::move(file));
  }
  if (!in.done()) return std::nullopt;
  return part;
}

std::optional<uint64_t> journalNumber(const std::string& file_name) {
  if (!file_name.starts_with(kFilePrefix) || !file_name.ends_with(kFileSuffix)) return std::nullopt;
  std::string_view digits(file_name);
  digits.remove_prefix(kFilePrefix.size());
  digits.remove_suffix(kFileSuffix.size());
  uint64_t number = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
  if (ec != std::errc() || ptr != digits.data() + digits.size()) return std::nullopt;
  return number;
}

std::expected<std::string, std::string> readWhole(const fs::path& path) {
  auto fd = openFd(path, O_RDONLY);
  if (!fd) return std::unexpected(fmt::format("{}: {}", path.string(), fd.error()));
  std::string bytes;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd->get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      return std::unexpected(fmt::format("{}: read failed: {}", path.string(), errnoText(errno)));
    if (n == 0) return bytes;
    bytes.append(buffer, static_cast<std::size_t>(n));
  }
}

// Writes the part into `tmp_journal_<name>`, every file and the directory fsynced, then puts it
// in place of whatever `<name>` holds and fsyncs `table_dir`.
std::expected<void, std::string> rewritePart(const fs::path& table_dir, const JournaledPart& part) {
  const fs::path tmp = table_dir / ("tmp_journal_" + part.name);
  const fs::path target = table_dir / part.name;
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (auto written = writePartImage(tmp, part.files, PartSync::kNow); !written) return written;
  fs::remove_all(target, ec);
  if (ec)
    return std::unexpected(fmt::format("cannot remove {}: {}", target.string(), ec.message()));
  if (auto renamed = renamePath(tmp, target); !renamed) return renamed;
  return fsyncDirectory(table_dir);
}

}  // namespace

std::string JournaledPart::encodeRecord() const {
  return encodeJournalRecord(name, files);
}

std::string encodeJournalRecord(std::string_view name, const std::vector<PartFile>& files) {
  std::string payload;
  put(payload, static_cast<uint16_t>(name.size()));
  payload += name;
  put(payload, static_cast<uint32_t>(files.size()));
  for (const auto& file : files) {
    put(payload, static_cast<uint16_t>(file.name.size()));
    payload += file.name;
    put(payload, static_cast<uint64_t>(file.bytes.size()));
    payload += file.bytes;
  }
  const Hash128 hash = hash128(payload);
  std::string record(kMagic);
  put(record, static_cast<uint32_t>(payload.size()));
  put(record, hash.high);
  put(record, hash.low);
  record += payload;
  return record;
}

DecodedJournal decodeJournal(std::string_view bytes) {
  DecodedJournal decoded;
  std::size_t offset = 0;
  while (offset < bytes.size()) {
    // A file's zero-filled rest (kSpareBytes) is its clean end: a record starts with "RTJ1".
    if (bytes.find_first_not_of('\0', offset) == std::string_view::npos) break;
    auto damaged = [&](std::string_view what) {
      decoded.damage =
          fmt::format("record {} at byte {}: {}", decoded.parts.size() + 1, offset, what);
    };
    const std::string_view rest = bytes.substr(offset);
    if (rest.size() < kHeaderBytes) {
      damaged("cut short in its header");
      break;
    }
    if (rest.substr(0, kMagic.size()) != kMagic) {
      damaged("no record marker");
      break;
    }
    uint32_t size = 0;
    Hash128 expected;
    std::memcpy(&size, rest.data() + 4, sizeof(size));
    std::memcpy(&expected.high, rest.data() + 8, sizeof(expected.high));
    std::memcpy(&expected.low, rest.data() + 16, sizeof(expected.low));
    if (size > kMaxRecordBytes || rest.size() - kHeaderBytes < size) {
      damaged(fmt::format("cut short ({} payload bytes announced, {} present)", size,
                          rest.size() - kHeaderBytes));
      break;
    }
    const std::string_view payload = rest.substr(kHeaderBytes, size);
    if (hash128(payload) != expected) {
      damaged("payload does not match its hash");
      break;
    }
    auto part = decodePayload(payload);
    if (!part) {
      damaged("malformed payload");
      break;
    }
    decoded.parts.push_back(std::move(*part));
    offset += kHeaderBytes + size;
  }
  return decoded;
}

std::expected<std::unique_ptr<PartJournal>, std::string> PartJournal::open(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return std::unexpected(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  std::unique_ptr<PartJournal> journal(new PartJournal(dir));
  std::vector<std::pair<uint64_t, fs::path>> found;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (auto number = journalNumber(it->path().filename().string()))
      found.emplace_back(*number, it->path());
  }
  if (ec) return std::unexpected(fmt::format("cannot list {}: {}", dir.string(), ec.message()));
  std::sort(found.begin(), found.end());
  for (const auto& [number, path] : found) {
    journal->older_.push_back(path);
    journal->next_number_ = number + 1;
    journal->pending_bytes_ += fs::file_size(path, ec);
  }
  // A spare a crash interrupted may not be all zeros.
  fs::remove(dir / kSpareName, ec);
  (void)journal->prepareSpare();  // without one, the first file is appended to as it grows
  {
    std::lock_guard lock(journal->mu_);
    if (auto started = journal->startFile(); !started) return std::unexpected(started.error());
  }
  (void)journal->prepareSpare();  // for the first checkpoint's rotation
  return journal;
}

std::expected<void, std::string> PartJournal::prepareSpare() {
  {
    std::lock_guard lock(mu_);
    if (spare_ready_ || preparing_spare_) return {};
    preparing_spare_ = true;
  }
  const fs::path path = dir_ / kSpareName;
  auto made = [&]() -> std::expected<void, std::string> {
    auto fd = openFd(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (!fd) return std::unexpected(fmt::format("{}: {}", path.string(), fd.error()));
    const std::string zeros(1 << 20, '\0');
    for (uint64_t done = 0; done < kSpareBytes; done += zeros.size()) {
      if (auto written = pwriteAll(fd->get(), fd->path(), zeros, done); !written) return written;
    }
    if (auto synced = fsyncFd(*fd); !synced) return synced;
    return fd->close();
  }();
  std::lock_guard lock(mu_);
  preparing_spare_ = false;
  if (!made)
    return std::unexpected(
        fmt::format("part journal: preparing {}: {}", path.string(), made.error()));
  spare_ready_ = true;
  return {};
}

PartJournal::~PartJournal() {
  if (fd_ >= 0) ::close(fd_);
}

std::expected<void, std::string> PartJournal::startFile() {
  current_ = dir_ / fmt::format("{}{:010}{}", kFilePrefix, next_number_++, kFileSuffix);
  file_offset_ = 0;
  // The spare becomes the file (its name made durable below), or a new empty file is.
  const bool spare = std::exchange(spare_ready_, false) && renamePath(dir_ / kSpareName, current_);
  auto fd = openFd(current_, spare ? O_WRONLY : O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (!fd) return std::unexpected(fmt::format("{}: {}", current_.string(), fd.error()));
  // The file's name must survive a crash with the records in it.
  if (auto synced = fsyncDirectory(dir_); !synced) return synced;
  fd_ = dup(fd->get());
  if (fd_ < 0)
    return std::unexpected(fmt::format("{}: dup failed: {}", current_.string(), errnoText(errno)));
  return {};
}

std::expected<void, std::string> PartJournal::append(const std::string& name,
                                                     const PartImage& image) {
  return appendRecord(encodeJournalRecord(name, image.files));
}

std::expected<void, std::string> PartJournal::appendRecord(const std::string& record) {
  std::unique_lock lock(mu_);
  synced_cv_.wait(lock, [this] { return !rotating_; });
  // Until this append returns, a rotation waits for it: it may still sync the current file.
  ++in_flight_;
  struct Leaving {
    PartJournal& journal;
    ~Leaving() {  // with mu_ held: `lock` outlives this
      --journal.in_flight_;
      journal.synced_cv_.notify_all();
    }
  } leaving{*this};
  if (!failed_.empty()) return std::unexpected(failed_);
  if (fd_ < 0) {
    if (auto started = startFile(); !started) return std::unexpected(started.error());
  }
  if (auto written = pwriteAll(fd_, current_.native(), record, file_offset_); !written) {
    // A torn record would hide every record after it.
    failed_ = failure_ = fmt::format("part journal {}: {}", current_.string(), written.error());
    failed_ranges_.emplace_back(synced_, appended_);  // their fsync is never attempted
    return std::unexpected(failed_);
  }
  appended_ += record.size();
  file_offset_ += record.size();
  pending_bytes_ += record.size();
  const uint64_t mine = appended_;
  // Group commit: one fdatasync covers every record written before it started.
  // A checkpoint may have cleared failed_ (and later syncs moved synced_ on) since this record
  // failed: its offset says.
  auto failedRecord = [&] {
    return std::ranges::any_of(failed_ranges_,
                               [&](const auto& r) { return r.first < mine && mine <= r.second; });
  };
  while (synced_ < mine) {
    if (failedRecord()) return std::unexpected(failure_);
    if (!failed_.empty()) return std::unexpected(failed_);
    if (syncing_) {
      synced_cv_.wait(lock);
      continue;
    }
    syncing_ = true;
    const uint64_t target = appended_;
    // rotate() waits for syncing_ to clear before it closes fd_ or changes current_.
    const int fd = fd_;
    const std::string path = current_.native();
    lock.unlock();
    auto synced = fdatasyncFd(fd, path);
    lock.lock();
    syncing_ = false;
    // After a failed fsync the kernel may have dropped the dirty pages: never trust a retry.
    if (!synced) {
      failed_ = failure_ = fmt::format("part journal {}: {}", path, synced.error());
      failed_ranges_.emplace_back(synced_, appended_);
    } else {
      synced_ = std::max(synced_, target);
    }
    synced_cv_.notify_all();
  }
  if (failedRecord()) return std::unexpected(failure_);
  return {};
}

std::expected<std::vector<std::string>, std::string> PartJournal::restore(
    const fs::path& table_dir, const std::function<bool(const std::string&)>& wanted) const {
  std::vector<fs::path> files;
  {
    std::lock_guard lock(mu_);
    files = older_;
  }
  std::map<std::string, JournaledPart> latest;
  for (const auto& path : files) {
    auto bytes = readWhole(path);
    if (!bytes) return std::unexpected(bytes.error());
    DecodedJournal decoded = decodeJournal(*bytes);
    // A damaged tail is an append cut short by the crash, never acknowledged.
    for (auto& part : decoded.parts) latest[part.name] = std::move(part);
  }
  std::vector<JournaledPart> parts;
  for (auto& [name, part] : latest) parts.push_back(std::move(part));
  return restoreParts(table_dir, parts, wanted, "the part journal");
}

std::expected<std::vector<std::string>, std::string> restoreParts(
    const fs::path& table_dir, const std::vector<JournaledPart>& parts,
    const std::function<bool(const std::string&)>& wanted, std::string_view source) {
  std::vector<std::string> restored;
  for (const auto& part : parts) {
    if (!wanted(part.name)) continue;
    if (auto rewritten = rewritePart(table_dir, part); !rewritten) {
      return std::unexpected(
          fmt::format("restoring part {} from {}: {}", part.name, source, rewritten.error()));
    }
    restored.push_back(part.name);
  }
  return restored;
}

std::expected<void, std::string> PartJournal::checkpoint(const fs::path& table_dir) {
  return finishCheckpoint(rotate(), table_dir);
}

PartJournal::Rotation PartJournal::rotate() {
  Rotation rotation;
  std::unique_lock lock(mu_);
  if (pending_bytes_ == 0 && older_.empty()) return rotation;
  rotating_ = true;
  // Every append that started has returned: its record is synced, or it failed. Records of
  // failed appends may never be synced by anyone (an append that fails returns at once), so the
  // rotation does not wait for synced_ to reach appended_: once it waited forever after a full
  // disk, and every append with it.
  synced_cv_.wait(lock, [this] { return in_flight_ == 0; });
  rotation.covered = std::move(older_);
  rotation.bytes = pending_bytes_;
  older_.clear();
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
    rotation.covered.push_back(current_);
  }
  // Appends after this point go to a new file, which this checkpoint does not cover.
  failed_.clear();
  pending_bytes_ = 0;
  (void)startFile();  // on failure the next append tries again
  rotating_ = false;
  synced_cv_.notify_all();
  return rotation;
}

void PartJournal::cancelCheckpoint(Rotation rotation) {
  if (rotation.covered.empty()) return;
  std::lock_guard lock(mu_);
  older_.insert(older_.begin(), rotation.covered.begin(), rotation.covered.end());
  // At least 1: a checkpoint is still due, also for files only an earlier process appended to.
  pending_bytes_ += std::max<uint64_t>(rotation.bytes, 1);
}

std::expected<void, std::string> PartJournal::finishCheckpoint(Rotation rotation,
                                                               const fs::path& table_dir) {
  const std::vector<fs::path> covered = rotation.covered;
  if (covered.empty()) return {};
  if (auto synced = syncFileSystem(table_dir); !synced) {
    cancelCheckpoint(std::move(rotation));
    return std::unexpected("part journal checkpoint: " + synced.error());
  }
  std::error_code ec;
  for (const auto& path : covered) fs::remove(path, ec);
  // For the next rotation, ready long before it. Without one (it failed), the next file grows by
  // appends: slower fdatasyncs, nothing else.
  (void)prepareSpare();
  return {};
}

uint64_t PartJournal::pendingBytes() const {
  std::lock_guard lock(mu_);
  return pending_bytes_;
}

std::vector<fs::path> PartJournal::filesForTest() const {
  std::lock_guard lock(mu_);
  std::vector<fs::path> files = older_;
  if (fd_ >= 0) files.push_back(current_);
  return files;
}

}  // namespace rtable::core
