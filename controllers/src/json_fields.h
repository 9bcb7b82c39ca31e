// Reading a custom resource's spec field by field with the field's path at hand (private).
//
// A failed check throws SpecFailure, which the public parse() functions catch and return as a
// SpecError value: the exception never leaves this library. Every read marks its key as known so
// rejectUnknown() can name a misspelt field (the apiserver would prune it silently).
// A JsonFields refers to the object it reads (which must outlive it) and lives for one parse, on
// one thread.
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "rtable/controllers/spec_error.h"

namespace rtable::controllers::detail {

struct SpecFailure {
  SpecError error;
};

[[noreturn]] inline void fail(std::string path, std::string message) {
  throw SpecFailure{SpecError{std::move(path), std::move(message)}};
}

inline std::string jsonTypeName(const nlohmann::json& value) {
  if (value.is_number_integer()) return "integer";
  if (value.is_number()) return "number";
  return value.type_name();
}

inline std::string indexPath(std::string_view path, std::size_t index) {
  return fmt::format("{}[{}]", path, index);
}

// An integral JSON number that fits an int64 (5 or 5.0), else nullopt. (A double outside the
// int64 range must not be cast: undefined behaviour, found by fuzz_crd_specs.)
inline std::optional<int64_t> integralValue(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number_float()) {
    const double d = value.get<double>();
    // [-2^63, 2^63): every double there converts exactly when it is integral.
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return std::nullopt;
    if (d == std::trunc(d)) return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

// Any integral JSON number, in the int64 range or not (5, 5.0, 1e23, 2^64 - 1).
inline bool wholeNumber(const nlohmann::json& value) {
  if (value.is_number_integer()) return true;
  if (!value.is_number_float()) return false;
  const double d = value.get<double>();
  return std::isfinite(d) && d == std::trunc(d);
}

inline void checkPattern(const std::string& path, const std::string& value,
                         const std::regex& pattern, std::string_view what) {
  if (!std::regex_match(value, pattern)) fail(path, fmt::format("'{}' is not {}", value, what));
}

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string path)
      : object_(object), path_(std::move(path)) {
    if (!object_.is_object())
      fail(path_, fmt::format("expected an object, got {}", jsonTypeName(object_)));
  }

  const std::string& path() const { return path_; }
  std::string at(std::string_view key) const { return fmt::format("{}.{}", path_, key); }

  // The value, or nullptr when absent or null (the apiserver treats both as unset).
  const nlohmann::json* find(const std::string& key) {
    seen_.insert(key);
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  std::optional<std::string> optionalString(const std::string& key, std::size_t max_length = 0) {
    const nlohmann::json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_string())
      fail(at(key), fmt::format("expected a string, got {}", jsonTypeName(*value)));
    std::string text = value->get<std::string>();
    if (max_length > 0 && text.size() > max_length) {
      fail(at(key), fmt::format("may not be longer than {} characters", max_length));
    }
    return text;
  }

  std::string string(const std::string& key, std::size_t max_length = 0) {
    auto value = optionalString(key, max_length);
    if (!value) fail(at(key), "required");
    return *value;
  }

  std::optional<int64_t> optionalInteger(const std::string& key, int64_t min, int64_t max) {
    const nlohmann::json* value = find(key);
    if (!value) return std::nullopt;
    auto number = integralValue(*value);
    if (!number && wholeNumber(*value)) {  // beyond int64: out of any range asked for
      fail(at(key), fmt::format("must be from {} to {}, got {}", min, max,
                                value->is_number_float() ? fmt::format("{}", value->get<double>())
                                                         : value->dump()));
    }
    if (!number) fail(at(key), fmt::format("expected an integer, got {}", jsonTypeName(*value)));
    if (*number < min || *number > max) {
      fail(at(key), fmt::format("must be from {} to {}, got {}", min, max, *number));
    }
    return number;
  }

  int64_t integer(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
    return optionalInteger(key, min, max).value_or(fallback);
  }

  double number(const std::string& key, double fallback, double min, double max) {
    const nlohmann::json* value = find(key);
    if (!value) return fallback;
    if (!value->is_number())
      fail(at(key), fmt::format("expected a number, got {}", jsonTypeName(*value)));
    const double number = value->get<double>();
    if (number < min || number > max)
      fail(at(key), fmt::format("must be from {} to {}, got {}", min, max, number));
    return number;
  }

  bool boolean(const std::string& key, bool fallback) {
    const nlohmann::json* value = find(key);
    if (!value) return fallback;
    if (!value->is_boolean())
      fail(at(key), fmt::format("expected true or false, got {}", jsonTypeName(*value)));
    return value->get<bool>();
  }

  // An array (empty when absent), at most `max_items` long.
  const nlohmann::json& array(const std::string& key, std::size_t max_items) {
    static const nlohmann::json kEmpty = nlohmann::json::array();
    const nlohmann::json* value = find(key);
    if (!value) return kEmpty;
    if (!value->is_array())
      fail(at(key), fmt::format("expected a list, got {}", jsonTypeName(*value)));
    if (value->size() > max_items)
      fail(at(key), fmt::format("may hold at most {} items", max_items));
    return *value;
  }

  // A map of strings (empty when absent).
  std::map<std::string, std::string> stringMap(const std::string& key) {
    std::map<std::string, std::string> result;
    const nlohmann::json* value = find(key);
    if (!value) return result;
    if (!value->is_object())
      fail(at(key), fmt::format("expected a map, got {}", jsonTypeName(*value)));
    for (const auto& [name, item] : value->items()) {
      if (!item.is_string())
        fail(at(key) + "." + name, fmt::format("expected a string, got {}", jsonTypeName(item)));
      result.emplace(name, item.get<std::string>());
    }
    return result;
  }

  void rejectUnknown() const {
    for (const auto& [key, value] : object_.items()) {
      if (!seen_.contains(key)) fail(at(key), "unknown field");
    }
  }

 private:
  const nlohmann::json& object_;
  std::string path_;
  std::set<std::string> seen_;
};

inline nlohmann::json stringMapJson(const std::map<std::string, std::string>& map) {
  nlohmann::json result = nlohmann::json::object();
  for (const auto& [k, v] : map) result[k] = v;
  return result;
}

}  // namespace rtable::controllers::detail
