// Label and field selectors in the apiserver's string syntax (k8s.io/apimachinery/pkg/labels):
// `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x,y)`, `a` (exists), `!a` (does not exist),
// joined by commas (AND). Used by the fake client and by the informer's cache. Parsed selectors
// are immutable values: safe to share between threads.
#pragma once

#include <expected>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::op {

struct LabelRequirement {
  enum class Op { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  std::string key;
  Op op = Op::kEquals;
  std::vector<std::string> values;

  bool matches(const std::map<std::string, std::string>& labels) const;
};

class LabelSelector {
 public:
  // The empty string selects everything. Errors name the offending requirement.
  static std::expected<LabelSelector, std::string> parse(std::string_view text);

  bool empty() const { return requirements_.empty(); }
  bool matches(const std::map<std::string, std::string>& labels) const;
  // Reads metadata.labels of a Kubernetes object.
  bool matchesObject(const nlohmann::json& object) const;
  const std::vector<LabelRequirement>& requirements() const { return requirements_; }

 private:
  std::vector<LabelRequirement> requirements_;
};

// A field selector limited to what every resource supports: metadata.name and metadata.namespace
// with =, == and !=. Other fields are rejected, as the apiserver does for most types.
class FieldSelector {
 public:
  static std::expected<FieldSelector, std::string> parse(std::string_view text);
  bool matchesObject(const nlohmann::json& object) const;

 private:
  struct Term {
    std::string field;
    std::string value;
    bool equals = true;
  };
  std::vector<Term> terms_;
};

std::map<std::string, std::string> objectLabels(const nlohmann::json& object);

}  // namespace rtable::op
