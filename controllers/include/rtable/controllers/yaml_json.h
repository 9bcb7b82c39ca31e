// YAML text to nlohmann::json, the way kubectl reads manifests: a file may hold several documents
// separated by `---`; plain scalars follow the YAML 1.2 core schema (null, true/false, integers,
// floats), quoted scalars are always strings. Plain functions, no state: thread-safe.
#pragma once

#include <expected>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::controllers {

// Every non-empty document, in order. The error says where the YAML is broken.
std::expected<std::vector<nlohmann::json>, std::string> yamlDocumentsToJson(std::string_view text);

// Exactly one document.
std::expected<nlohmann::json, std::string> yamlToJson(std::string_view text);

}  // namespace rtable::controllers
