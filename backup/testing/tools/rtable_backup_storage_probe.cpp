// rtable-backup-storage-probe: runs FilesystemStorage operations on a root and prints each result
// on a line, for tests that need another process's view of a file system: a tmpfs mounted in a
// private mount namespace (full, or read-only), or a user without write permission
// (backup/tests/unit/filesystem_storage_test.cpp).
//   rtable-backup-storage-probe ROOT OPERATION...
//     put:NAME:BYTES   putBytes of BYTES bytes     -> "ok" or "<Kind>: <message>"
//     read:NAME        read                        -> "ok <size>" or "<Kind>: <message>"
//     list:PREFIX      list                        -> "ok <name> <name>..." or "<Kind>: ..."
//     entries          every entry under ROOT, temporary files included (find -mindepth 1)
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "rtable/backup/filesystem_storage.h"

namespace {

using rtable::backup::StorageError;
using rtable::backup::storageErrorKindName;

std::string describe(const StorageError& error) {
  return std::string(storageErrorKindName(error.kind)) + ": " + error.message;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s ROOT OPERATION...\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  rtable::backup::FilesystemStorage storage(root);
  for (int i = 2; i < argc; ++i) {
    const std::string_view operation = argv[i];
    std::string line;
    if (operation.starts_with("put:")) {
      const auto colon = operation.rfind(':');
      const std::string name(operation.substr(4, colon - 4));
      const std::string bytes(std::stoull(std::string(operation.substr(colon + 1))), 'x');
      auto put = storage.putBytes(name, bytes);
      line = put ? "ok" : describe(put.error());
    } else if (operation.starts_with("read:")) {
      auto read = storage.read(std::string(operation.substr(5)));
      line = read ? "ok " + std::to_string(read->size()) : describe(read.error());
    } else if (operation.starts_with("list:")) {
      auto names = storage.list(std::string(operation.substr(5)));
      if (names) {
        line = "ok";
        for (const auto& name : *names) line += " " + name;
      } else {
        line = describe(names.error());
      }
    } else if (operation == "entries") {
      line = "entries";
      std::error_code ec;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(root, ec)) {
        line += " " + entry.path().lexically_relative(root).generic_string();
      }
      if (ec) line += " (error: " + ec.message() + ")";
    } else {
      std::fprintf(stderr, "unknown operation %s\n", argv[i]);
      return 2;
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}
