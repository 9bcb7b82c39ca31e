#include "rtable/controllers/yaml_json.h"

#include <gtest/gtest.h>

namespace rtable::controllers {
namespace {

using nlohmann::json;

TEST(YamlToJson, PlainScalarsByTheCoreSchemaQuotedOnesAreStrings) {
  auto value = yamlToJson(R"(
int: 42
negative: -7
float: 2.5
exp: 1e3
yes_is_a_string: yes
t: true
f: False
n: null
tilde: ~
empty:
quoted_int: "42"
quoted_bool: 'true'
cron: "0 3 * * *"
type: Nullable(Float64)
list: [a, 1, {b: c}]
nested: {x: {y: [1, 2]}}
big: 99999999999999999999
)");
  ASSERT_TRUE(value) << value.error();
  const json expected = {{"int", 42},
                         {"negative", -7},
                         {"float", 2.5},
                         {"exp", 1000.0},
                         {"yes_is_a_string", "yes"},
                         {"t", true},
                         {"f", false},
                         {"n", nullptr},
                         {"tilde", nullptr},
                         {"empty", nullptr},
                         {"quoted_int", "42"},
                         {"quoted_bool", "true"},
                         {"cron", "0 3 * * *"},
                         {"type", "Nullable(Float64)"},
                         {"list", {"a", 1, {{"b", "c"}}}},
                         {"nested", {{"x", {{"y", {1, 2}}}}}},
                         {"big", "99999999999999999999"}};
  EXPECT_EQ(*value, expected);
  EXPECT_TRUE((*value)["int"].is_number_integer());
}

TEST(YamlToJson, SeveralDocuments) {
  auto documents = yamlDocumentsToJson("a: 1\n---\nb: 2\n---\n");
  ASSERT_TRUE(documents) << documents.error();
  ASSERT_EQ(documents->size(), 2u);
  EXPECT_EQ((*documents)[1], json({{"b", 2}}));
  EXPECT_FALSE(yamlToJson("a: 1\n---\nb: 2\n"));
}

TEST(YamlToJson, BrokenYamlIsAnError) {
  auto broken = yamlToJson("a: [1, 2\n");
  ASSERT_FALSE(broken);
  EXPECT_NE(broken.error().find("not valid YAML"), std::string::npos);
}

}  // namespace
}  // namespace rtable::controllers
