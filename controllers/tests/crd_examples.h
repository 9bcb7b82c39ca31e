// The files of crds/examples, for the tests that check every one of them (so a new example is
// tested without code changes):
//   crds/examples/*.yaml                  valid objects, one or more documents
//   crds/examples/invalid/*.yaml          one object each, to be rejected
//   crds/examples/invalid-updates/*.yaml  two documents: created, then updated and rejected
// An invalid file states what the rejection must name in comment lines:
//   # expect-rejected: spec.columns[2].type     (the field's path; required)
//   # expect-message: a column's type is immutable   (optional)
#pragma once

#include <algorithm>
#include <expected>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "rtable/controllers/yaml_json.h"

namespace rtable::controllers::testing {

struct ExampleFile {
  std::filesystem::path path;
  std::string text;
  std::vector<nlohmann::json> documents;
  std::string expect_rejected;  // "" for valid examples
  std::string expect_message;
};

inline std::filesystem::path crdsDir() {
  return RTABLE_CRDS_DIR;
}

inline std::string readText(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::string commentValue(const std::string& text, const std::string& key) {
  const std::string marker = "# " + key + ":";
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.starts_with(marker)) {
      std::string value = line.substr(marker.size());
      value.erase(0, value.find_first_not_of(' '));
      return value;
    }
  }
  return "";
}

// The *.yaml files of `dir` (not recursive), sorted by name. An unreadable file ends the list
// with an error.
inline std::expected<std::vector<ExampleFile>, std::string> loadExamples(
    const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> paths;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<ExampleFile> files;
  for (const auto& path : paths) {
    ExampleFile file;
    file.path = path;
    file.text = readText(path);
    auto documents = yamlDocumentsToJson(file.text);
    if (!documents) return std::unexpected(path.string() + ": " + documents.error());
    file.documents = std::move(*documents);
    file.expect_rejected = commentValue(file.text, "expect-rejected");
    file.expect_message = commentValue(file.text, "expect-message");
    files.push_back(std::move(file));
  }
  return files;
}

inline std::string kindOf(const nlohmann::json& object) {
  return object.value("kind", "");
}

}  // namespace rtable::controllers::testing
