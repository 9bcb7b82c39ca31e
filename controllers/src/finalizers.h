// Finalizers on an object (private): JSON patches that add or remove one, each a compare-and-swap
// on the object's resourceVersion, so a concurrent edit is never lost.
#pragma once

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace rtable::controllers::detail {

inline bool hasFinalizer(const nlohmann::json& object, std::string_view finalizer) {
  const nlohmann::json finalizers =
      object.value(nlohmann::json::json_pointer("/metadata/finalizers"), nlohmann::json::array());
  return std::find(finalizers.begin(), finalizers.end(), std::string(finalizer)) !=
         finalizers.end();
}

inline nlohmann::json resourceVersionTest(const nlohmann::json& object) {
  return {{"op", "test"},
          {"path", "/metadata/resourceVersion"},
          {"value", object.value(nlohmann::json::json_pointer("/metadata/resourceVersion"), "")}};
}

inline nlohmann::json addFinalizerPatch(const nlohmann::json& object, std::string_view finalizer) {
  nlohmann::json patch = nlohmann::json::array({resourceVersionTest(object)});
  if (object.contains(nlohmann::json::json_pointer("/metadata/finalizers"))) {
    patch.push_back(
        {{"op", "add"}, {"path", "/metadata/finalizers/-"}, {"value", std::string(finalizer)}});
  } else {
    patch.push_back({{"op", "add"},
                     {"path", "/metadata/finalizers"},
                     {"value", nlohmann::json::array({std::string(finalizer)})}});
  }
  return patch;
}

inline nlohmann::json removeFinalizerPatch(const nlohmann::json& object,
                                           std::string_view finalizer) {
  nlohmann::json rest = nlohmann::json::array();
  for (const auto& item : object.value(nlohmann::json::json_pointer("/metadata/finalizers"),
                                       nlohmann::json::array())) {
    if (item != std::string(finalizer)) rest.push_back(item);
  }
  return nlohmann::json::array(
      {resourceVersionTest(object),
       {{"op", "replace"}, {"path", "/metadata/finalizers"}, {"value", rest}}});
}

}  // namespace rtable::controllers::detail
