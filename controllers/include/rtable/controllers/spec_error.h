// SpecError: why a custom resource's spec cannot be used, naming the field by its path in the
// object as the apiserver does ("spec.columns[2].type: unknown type 'Foo'").
#pragma once

#include <string>

namespace rtable::controllers {

struct SpecError {
  std::string path;     // "spec.columns[2].type", "metadata.name"
  std::string message;  // what is wrong, without the path

  std::string toString() const { return path + ": " + message; }
  friend bool operator==(const SpecError&, const SpecError&) = default;
};

}  // namespace rtable::controllers
