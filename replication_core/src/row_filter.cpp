#include "rtable/replication_core/row_filter.h"

#include <fmt/format.h>

#include <cctype>
#include <charconv>
#include <cmath>

namespace rtable::core {
namespace {

class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  void skipSpace() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool atEnd() {
    skipSpace();
    return pos_ >= text_.size();
  }
  std::size_t position() const { return pos_; }

  std::string identifier() {
    skipSpace();
    std::size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }

  bool keyword(std::string_view word) {
    skipSpace();
    if (text_.size() - pos_ < word.size()) return false;
    for (std::size_t i = 0; i < word.size(); ++i) {
      if (std::toupper(static_cast<unsigned char>(text_[pos_ + i])) != word[i]) return false;
    }
    const std::size_t after = pos_ + word.size();
    if (after < text_.size() &&
        (std::isalnum(static_cast<unsigned char>(text_[after])) || text_[after] == '_')) {
      return false;
    }
    pos_ = after;
    return true;
  }

  std::string op() {
    skipSpace();
    for (std::string_view candidate : {"==", "!=", "<>", "<=", ">=", "=", "<", ">"}) {
      if (text_.substr(pos_).starts_with(candidate)) {
        pos_ += candidate.size();
        return std::string(candidate);
      }
    }
    return {};
  }

  // A quoted string ('' or \' for a quote) or a bare number; `quoted` says which.
  std::expected<std::string, std::string> literal(bool& quoted) {
    skipSpace();
    quoted = pos_ < text_.size() && text_[pos_] == '\'';
    if (!quoted) {
      std::size_t start = pos_;
      while (pos_ < text_.size() && !std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      if (start == pos_) return std::unexpected(std::string("a value is missing"));
      return std::string(text_.substr(start, pos_ - start));
    }
    std::string value;
    for (++pos_; pos_ < text_.size(); ++pos_) {
      const char c = text_[pos_];
      if (c == '\\' && pos_ + 1 < text_.size()) {
        value += text_[++pos_];
      } else if (c == '\'') {
        if (pos_ + 1 < text_.size() && text_[pos_ + 1] == '\'') {
          value += '\'';
          ++pos_;
        } else {
          ++pos_;
          return value;
        }
      } else {
        value += c;
      }
    }
    return std::unexpected(std::string("a quoted value is not closed"));
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

template <class T>
std::expected<T, std::string> parseNumber(const std::string& text) {
  T value{};
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) {
    return std::unexpected(fmt::format("'{}' is not a number of this column's type", text));
  }
  return value;
}

std::expected<ColumnValues, std::string> literalFor(const DataType& type, const std::string& text) {
  ColumnValues values = emptyValuesFor(type.id);
  std::string error;
  std::visit(
      [&](auto& vector) {
        using T = typename std::decay_t<decltype(vector)>::value_type;
        if constexpr (std::is_same_v<T, std::string>) {
          vector.push_back(text);
        } else if (type.id == TypeId::kDate) {
          auto days = parseDate(text);
          if (days)
            vector.push_back(static_cast<T>(*days));
          else
            error = days.error();
        } else if (type.id == TypeId::kDateTime) {
          auto seconds = parseDateTime(text);
          if (seconds)
            vector.push_back(static_cast<T>(*seconds));
          else
            error = seconds.error();
        } else if (type.id == TypeId::kBool) {
          if (text == "true" || text == "1")
            vector.push_back(1);
          else if (text == "false" || text == "0")
            vector.push_back(0);
          else
            error = fmt::format("'{}' is not true or false", text);
        } else {
          auto number = parseNumber<T>(text);
          if (number)
            vector.push_back(*number);
          else
            error = number.error();
        }
      },
      values);
  if (!error.empty()) return std::unexpected(error);
  return values;
}

}  // namespace

std::expected<RowFilter, std::string> RowFilter::parse(std::string_view text,
                                                       const TableSchema& schema) {
  RowFilter filter;
  Lexer lexer(text);
  if (lexer.atEnd()) return filter;
  for (;;) {
    const std::string name = lexer.identifier();
    if (name.empty()) {
      return std::unexpected(
          fmt::format("where: expected a column name at position {}", lexer.position() + 1));
    }
    auto index = schema.columnIndex(name);
    if (!index) return std::unexpected(fmt::format("where: unknown column '{}'", name));
    const DataType& type = schema.columns()[*index].type;
    Condition condition{*index, Op::kEq, {}};
    if (lexer.keyword("IS")) {
      condition.op = lexer.keyword("NOT") ? Op::kIsNotNull : Op::kIsNull;
      if (!lexer.keyword("NULL"))
        return std::unexpected(fmt::format("where: column '{}': expected IS [NOT] NULL", name));
    } else {
      const std::string op = lexer.op();
      if (op.empty())
        return std::unexpected(
            fmt::format("where: column '{}': expected an operator (= != < <= > >= IS)", name));
      condition.op = op == "=" || op == "=="    ? Op::kEq
                     : op == "!=" || op == "<>" ? Op::kNe
                     : op == "<"                ? Op::kLt
                     : op == "<="               ? Op::kLe
                     : op == ">"                ? Op::kGt
                                                : Op::kGe;
      bool quoted = false;
      auto literal = lexer.literal(quoted);
      if (!literal)
        return std::unexpected(fmt::format("where: column '{}': {}", name, literal.error()));
      auto value = literalFor(type, *literal);
      if (!value)
        return std::unexpected(
            fmt::format("where: column '{}' ({}): {}", name, type.name(), value.error()));
      condition.literal = std::move(*value);
    }
    filter.conditions_.push_back(std::move(condition));
    if (lexer.atEnd()) return filter;
    if (!lexer.keyword("AND")) {
      return std::unexpected(
          fmt::format("where: expected AND at position {}", lexer.position() + 1));
    }
  }
}

std::vector<std::size_t> RowFilter::matchingRows(const Block& block) const {
  const std::size_t rows = block.rows();
  std::vector<uint8_t> pass(rows, 1);
  for (const auto& condition : conditions_) {
    const Column& column = block.columns[condition.column];
    for (std::size_t row = 0; row < rows; ++row) {
      if (!pass[row]) continue;
      const bool is_null = column.isNull(row);
      if (condition.op == Op::kIsNull || condition.op == Op::kIsNotNull) {
        pass[row] = is_null == (condition.op == Op::kIsNull);
        continue;
      }
      if (is_null) {
        pass[row] = 0;
        continue;
      }
      pass[row] = std::visit(
          [&](const auto& values) -> uint8_t {
            using V = std::decay_t<decltype(values)>;
            const auto& x = values[row];
            const auto& y = std::get<V>(condition.literal)[0];
            switch (condition.op) {
              case Op::kEq:
                return x == y;
              case Op::kNe:
                return x != y;
              case Op::kLt:
                return x < y;
              case Op::kLe:
                return x <= y;
              case Op::kGt:
                return x > y;
              case Op::kGe:
                return x >= y;
              default:
                return 0;
            }
          },
          column.values);
    }
  }
  std::vector<std::size_t> matching;
  for (std::size_t row = 0; row < rows; ++row) {
    if (pass[row]) matching.push_back(row);
  }
  return matching;
}

}  // namespace rtable::core
