// Reading a backup back: its manifest, and any of its parts as a part directory, every file
// checked against the size and checksum the manifest recorded (restore, and the tests that
// compare a backup with its table).
//
// Thread safety: functions of their arguments; the storage must be thread-safe.
#pragma once

#include <expected>
#include <filesystem>
#include <string>

#include "rtable/backup/backup_manifest.h"
#include "rtable/backup/backup_storage.h"

namespace rtable::backup {

// The manifest of `name` (kNotFound: no such complete backup).
StorageResult<BackupManifest> readManifest(BackupStorage& storage, const std::string& name);

// Writes part `part` of `table` into `dir` (which must not exist; removed on failure), each file
// from its data file, its size and checksum verified. The error names the file
// ("events/202612_0_5_1/x.bin: checksum 3f.. where the manifest says 9a.. (the data file is
// damaged)"). Each file is streamed into place by BackupStorage::readToFile (which fsyncs it)
// and checked by reading it back in chunks, so no file is ever held in memory whole: a merged
// part's column files can be gigabytes. The caller still makes the part as a whole durable.
std::expected<void, std::string> materializePart(BackupStorage& storage,
                                                 const BackupManifest& manifest,
                                                 const std::string& table, const std::string& part,
                                                 const std::filesystem::path& dir);

}  // namespace rtable::backup
