#include "rtable/operator/label_selector.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

namespace rtable::op {
namespace {

using nlohmann::json;

enum class TokenKind {
  kIdentifier,
  kComma,
  kOpenParen,
  kCloseParen,
  kEquals,
  kDoubleEquals,
  kNotEquals,
  kBang,
  kEnd
};

struct Token {
  TokenKind kind;
  std::string text;
};

bool isSpecial(char c) {
  return c == ',' || c == '(' || c == ')' || c == '=' || c == '!' ||
         std::isspace(static_cast<unsigned char>(c));
}

std::vector<Token> tokenize(std::string_view text) {
  std::vector<Token> tokens;
  std::size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == ',') {
      tokens.push_back({TokenKind::kComma, ","});
      ++i;
    } else if (c == '(') {
      tokens.push_back({TokenKind::kOpenParen, "("});
      ++i;
    } else if (c == ')') {
      tokens.push_back({TokenKind::kCloseParen, ")"});
      ++i;
    } else if (c == '=') {
      if (i + 1 < text.size() && text[i + 1] == '=') {
        tokens.push_back({TokenKind::kDoubleEquals, "=="});
        i += 2;
      } else {
        tokens.push_back({TokenKind::kEquals, "="});
        ++i;
      }
    } else if (c == '!') {
      if (i + 1 < text.size() && text[i + 1] == '=') {
        tokens.push_back({TokenKind::kNotEquals, "!="});
        i += 2;
      } else {
        tokens.push_back({TokenKind::kBang, "!"});
        ++i;
      }
    } else {
      std::size_t end = i;
      while (end < text.size() && !isSpecial(text[end])) ++end;
      tokens.push_back({TokenKind::kIdentifier, std::string(text.substr(i, end - i))});
      i = end;
    }
  }
  tokens.push_back({TokenKind::kEnd, ""});
  return tokens;
}

// Label keys: [prefix/]name, name of alphanumerics, '-', '_', '.' (apimachinery validates more
// strictly; the apiserver is the judge, this only has to parse what it accepts).
bool validKey(std::string_view key) {
  if (key.empty() || key.size() > 317) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
           c == '/';
  });
}

bool validValue(std::string_view value) {
  if (value.size() > 63) return false;
  return std::all_of(value.begin(), value.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text), tokens_(tokenize(text)) {}

  std::expected<std::vector<LabelRequirement>, std::string> parse() {
    std::vector<LabelRequirement> out;
    if (peek().kind == TokenKind::kEnd) return out;
    for (;;) {
      auto requirement = parseRequirement();
      if (!requirement) return std::unexpected(requirement.error());
      out.push_back(std::move(*requirement));
      const Token& next = take();
      if (next.kind == TokenKind::kEnd) return out;
      if (next.kind != TokenKind::kComma)
        return fail(fmt::format("expected ',' before '{}'", next.text));
    }
  }

 private:
  const Token& peek() const { return tokens_[pos_]; }
  const Token& take() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }

  std::unexpected<std::string> fail(const std::string& what) const {
    return std::unexpected(fmt::format("unable to parse requirement in '{}': {}", text_, what));
  }

  std::expected<LabelRequirement, std::string> parseRequirement() {
    LabelRequirement r;
    if (peek().kind == TokenKind::kBang) {
      take();
      const Token& key = take();
      if (key.kind != TokenKind::kIdentifier || !validKey(key.text)) {
        return fail(fmt::format("invalid label key '{}' after '!'", key.text));
      }
      r.key = key.text;
      r.op = LabelRequirement::Op::kDoesNotExist;
      return r;
    }
    const Token& key = take();
    if (key.kind != TokenKind::kIdentifier || !validKey(key.text)) {
      return fail(fmt::format("invalid label key '{}'", key.text));
    }
    r.key = key.text;
    const Token& op = peek();
    switch (op.kind) {
      case TokenKind::kComma:
      case TokenKind::kEnd:
        r.op = LabelRequirement::Op::kExists;
        return r;
      case TokenKind::kEquals:
      case TokenKind::kDoubleEquals:
      case TokenKind::kNotEquals: {
        r.op = op.kind == TokenKind::kNotEquals ? LabelRequirement::Op::kNotEquals
                                                : LabelRequirement::Op::kEquals;
        take();
        // `a=` selects an empty value.
        std::string value;
        if (peek().kind == TokenKind::kIdentifier) value = take().text;
        if (!validValue(value)) return fail(fmt::format("invalid label value '{}'", value));
        r.values.push_back(std::move(value));
        return r;
      }
      case TokenKind::kIdentifier:
        if (op.text == "in" || op.text == "notin") {
          r.op = op.text == "in" ? LabelRequirement::Op::kIn : LabelRequirement::Op::kNotIn;
          take();
          if (take().kind != TokenKind::kOpenParen) return fail("expected '(' after " + op.text);
          return parseValueSet(std::move(r));
        }
        return fail(fmt::format("unknown operator '{}'", op.text));
      default:
        return fail(fmt::format("unexpected '{}' after key '{}'", op.text, r.key));
    }
  }

  std::expected<LabelRequirement, std::string> parseValueSet(LabelRequirement r) {
    for (;;) {
      std::string value;
      if (peek().kind == TokenKind::kIdentifier) value = take().text;
      if (!validValue(value)) return fail(fmt::format("invalid label value '{}'", value));
      r.values.push_back(std::move(value));
      const Token& next = take();
      if (next.kind == TokenKind::kCloseParen) break;
      if (next.kind != TokenKind::kComma) return fail("expected ',' or ')' in value set");
    }
    std::sort(r.values.begin(), r.values.end());
    return r;
  }

  std::string_view text_;
  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

bool LabelRequirement::matches(const std::map<std::string, std::string>& labels) const {
  auto it = labels.find(key);
  const bool has = it != labels.end();
  auto in = [&] {
    return has && std::find(values.begin(), values.end(), it->second) != values.end();
  };
  switch (op) {
    case Op::kEquals:
    case Op::kIn:
      return in();
    case Op::kNotEquals:
    case Op::kNotIn:
      return !in();  // as in apimachinery: a missing key satisfies != and notin
    case Op::kExists:
      return has;
    case Op::kDoesNotExist:
      return !has;
  }
  return false;
}

std::expected<LabelSelector, std::string> LabelSelector::parse(std::string_view text) {
  auto requirements = Parser(text).parse();
  if (!requirements) return std::unexpected(requirements.error());
  LabelSelector selector;
  selector.requirements_ = std::move(*requirements);
  return selector;
}

bool LabelSelector::matches(const std::map<std::string, std::string>& labels) const {
  return std::all_of(requirements_.begin(), requirements_.end(),
                     [&](const LabelRequirement& r) { return r.matches(labels); });
}

bool LabelSelector::matchesObject(const json& object) const {
  return empty() || matches(objectLabels(object));
}

std::map<std::string, std::string> objectLabels(const json& object) {
  std::map<std::string, std::string> labels;
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return labels;
  auto found = metadata->find("labels");
  if (found == metadata->end() || !found->is_object()) return labels;
  for (const auto& [key, value] : found->items()) {
    if (value.is_string()) labels.emplace(key, value.get<std::string>());
  }
  return labels;
}

std::expected<FieldSelector, std::string> FieldSelector::parse(std::string_view text) {
  FieldSelector selector;
  text = trim(text);
  if (text.empty()) return selector;
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view term = trim(text.substr(start, comma - start));
    Term t;
    std::size_t op = term.find("!=");
    std::size_t op_len = 2;
    t.equals = op == std::string_view::npos;
    if (t.equals) {
      op = term.find("==");
      if (op == std::string_view::npos) {
        op = term.find('=');
        op_len = 1;
      }
    }
    if (op == std::string_view::npos) {
      return std::unexpected(fmt::format("invalid field selector term '{}': no operator", term));
    }
    t.field = std::string(trim(term.substr(0, op)));
    t.value = std::string(trim(term.substr(op + op_len)));
    if (t.field != "metadata.name" && t.field != "metadata.namespace") {
      return std::unexpected(fmt::format("field label not supported: {}", t.field));
    }
    selector.terms_.push_back(std::move(t));
    start = comma + 1;
  }
  return selector;
}

bool FieldSelector::matchesObject(const json& object) const {
  for (const auto& term : terms_) {
    std::string actual;
    if (auto metadata = object.find("metadata");
        metadata != object.end() && metadata->is_object()) {
      const char* name = term.field == "metadata.name" ? "name" : "namespace";
      if (auto it = metadata->find(name); it != metadata->end() && it->is_string()) {
        actual = it->get<std::string>();
      }
    }
    if ((actual == term.value) != term.equals) return false;
  }
  return true;
}

}  // namespace rtable::op
