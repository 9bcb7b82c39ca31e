#include "rtable/operator/label_selector.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace rtable::op {
namespace {

using Labels = std::map<std::string, std::string>;

bool selects(std::string_view selector, const Labels& labels) {
  auto parsed = LabelSelector::parse(selector);
  EXPECT_TRUE(parsed) << selector << ": " << parsed.error();
  return parsed && parsed->matches(labels);
}

TEST(LabelSelectorTest, Operators) {
  const Labels l{{"app", "rtable"}, {"tier", "core"}, {"empty", ""}};
  EXPECT_TRUE(selects("", l));
  EXPECT_TRUE(selects("app=rtable", l));
  EXPECT_TRUE(selects("app==rtable", l));
  EXPECT_FALSE(selects("app=other", l));
  EXPECT_TRUE(selects("app!=other", l));
  EXPECT_FALSE(selects("app!=rtable", l));
  EXPECT_TRUE(selects("missing!=x", l));  // a missing key satisfies !=
  EXPECT_TRUE(selects("tier in (core, edge)", l));
  EXPECT_FALSE(selects("tier in (edge)", l));
  EXPECT_TRUE(selects("tier notin (edge)", l));
  EXPECT_FALSE(selects("tier notin (core,edge)", l));
  EXPECT_TRUE(selects("missing notin (x)", l));
  EXPECT_TRUE(selects("app", l));
  EXPECT_FALSE(selects("missing", l));
  EXPECT_TRUE(selects("!missing", l));
  EXPECT_FALSE(selects("!app", l));
  EXPECT_TRUE(selects("empty=", l));
  EXPECT_TRUE(selects("app=rtable, tier in (core), !missing", l));
  EXPECT_FALSE(selects("app=rtable,tier=edge", l));
  EXPECT_TRUE(selects("rtable.io/table=t1", {{"rtable.io/table", "t1"}}));
}

TEST(LabelSelectorTest, Errors) {
  for (const char* bad :
       {"app=rtable,", "=x", "a in b", "a in (b", "a b", "a=(b)", "!", "a>1", "a==b==c"}) {
    auto parsed = LabelSelector::parse(bad);
    EXPECT_FALSE(parsed) << bad;
    if (!parsed) {
      EXPECT_NE(parsed.error().find("unable to parse requirement"), std::string::npos);
    }
  }
}

TEST(LabelSelectorTest, Objects) {
  auto selector = LabelSelector::parse("app=rtable");
  ASSERT_TRUE(selector);
  EXPECT_TRUE(selector->matchesObject(
      nlohmann::json::parse(R"({"metadata":{"labels":{"app":"rtable"}}})")));
  EXPECT_FALSE(selector->matchesObject(nlohmann::json::parse(R"({"metadata":{}})")));
  EXPECT_FALSE(selector->matchesObject(nlohmann::json::object()));
}

TEST(FieldSelectorTest, NameAndNamespace) {
  const auto object = nlohmann::json::parse(R"({"metadata":{"name":"a","namespace":"ns"}})");
  auto sel = [&](const char* text) {
    auto parsed = FieldSelector::parse(text);
    EXPECT_TRUE(parsed) << text;
    return parsed && parsed->matchesObject(object);
  };
  EXPECT_TRUE(sel(""));
  EXPECT_TRUE(sel("metadata.name=a"));
  EXPECT_TRUE(sel("metadata.name==a,metadata.namespace=ns"));
  EXPECT_FALSE(sel("metadata.name!=a"));
  EXPECT_FALSE(sel("metadata.namespace=other"));
  EXPECT_FALSE(FieldSelector::parse("spec.nodeName=n1"));
  EXPECT_FALSE(FieldSelector::parse("metadata.name"));
}

}  // namespace
}  // namespace rtable::op
