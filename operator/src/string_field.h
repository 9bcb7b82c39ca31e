// A string member of a JSON object, "" when absent or not a string (the apiserver's optional
// fields), for the runtime's readers of Status and Lease objects.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace rtable::op::detail {

inline std::string stringField(const nlohmann::json& object, const char* name) {
  auto it = object.find(name);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

}  // namespace rtable::op::detail
