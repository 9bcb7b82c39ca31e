#include "rtable/controllers/yaml_json.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <regex>

namespace rtable::controllers {
namespace {

using nlohmann::json;

// A plain scalar by the YAML 1.2 core schema (what Kubernetes' YAML reader resolves too, except
// for YAML 1.1's yes/no/on/off, which are strings here).
json plainScalar(const std::string& text) {
  static const std::regex kNull("null|Null|NULL|~|");
  static const std::regex kTrue("true|True|TRUE");
  static const std::regex kFalse("false|False|FALSE");
  static const std::regex kInteger("[-+]?[0-9]+");
  static const std::regex kFloat(R"([-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?)");
  if (std::regex_match(text, kNull)) return nullptr;
  if (std::regex_match(text, kTrue)) return true;
  if (std::regex_match(text, kFalse)) return false;
  if (std::regex_match(text, kInteger)) {
    int64_t value = 0;
    const char* begin = text.data() + (text[0] == '+' ? 1 : 0);
    auto [end, error] = std::from_chars(begin, text.data() + text.size(), value);
    if (error == std::errc() && end == text.data() + text.size()) return value;
    return text;  // out of int64 range: kept as written
  }
  if (std::regex_match(text, kFloat)) return std::stod(text);
  return text;
}

json toJson(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nullptr;
    case YAML::NodeType::Scalar:
      // A quoted (or otherwise non-plain) scalar carries the tag "!": always a string.
      return node.Tag() == "!" ? json(node.Scalar()) : plainScalar(node.Scalar());
    case YAML::NodeType::Sequence: {
      json list = json::array();
      for (const auto& item : node) list.push_back(toJson(item));
      return list;
    }
    case YAML::NodeType::Map: {
      json object = json::object();
      for (const auto& entry : node) object[entry.first.as<std::string>()] = toJson(entry.second);
      return object;
    }
  }
  return nullptr;
}

}  // namespace

std::expected<std::vector<json>, std::string> yamlDocumentsToJson(std::string_view text) {
  try {
    std::vector<json> documents;
    for (const auto& node : YAML::LoadAll(std::string(text))) {
      if (node.IsNull()) continue;  // an empty document, e.g. after a trailing ---
      documents.push_back(toJson(node));
    }
    return documents;
  } catch (const YAML::Exception& e) {
    return std::unexpected(fmt::format("not valid YAML: {}", e.what()));
  }
}

std::expected<json, std::string> yamlToJson(std::string_view text) {
  auto documents = yamlDocumentsToJson(text);
  if (!documents) return std::unexpected(documents.error());
  if (documents->size() != 1) {
    return std::unexpected(fmt::format("expected one YAML document, found {}", documents->size()));
  }
  return std::move(documents->front());
}

}  // namespace rtable::controllers
