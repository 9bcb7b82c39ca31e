#include "s3_xml.h"

#include <fmt/format.h>

#include <charconv>
#include <functional>

namespace rtable::backup::s3xml {
namespace {

void appendUtf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xc0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xe0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (code_point & 0x3f));
  }
}

// The '>' that ends the tag opened at `lt`, past any quoted attribute value (which may hold '>').
std::size_t tagEnd(std::string_view xml, std::size_t lt) {
  char quote = 0;
  for (std::size_t i = lt + 1; i < xml.size(); ++i) {
    const char c = xml[i];
    if (quote) {
      if (c == quote) quote = 0;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '>') {
      return i;
    }
  }
  return std::string_view::npos;
}

// Calls `on_element(path, text)` for every element when it closes, with `path` the names from the
// root ("ListBucketResult/Contents/Key") and `text` its decoded character data (that of its
// children excluded). An error says what is malformed.
std::expected<void, std::string> walkElements(
    std::string_view xml,
    const std::function<void(std::string_view path, std::string_view text)>& on_element) {
  std::string path;
  std::vector<std::string> texts;  // the text of each open element
  std::size_t pos = 0;
  while (pos < xml.size()) {
    const std::size_t lt = xml.find('<', pos);
    const std::string_view chars =
        xml.substr(pos, (lt == std::string_view::npos ? xml.size() : lt) - pos);
    if (!texts.empty()) {
      auto decoded = decodeText(chars);
      if (!decoded) return std::unexpected(decoded.error());
      texts.back() += *decoded;
    }
    if (lt == std::string_view::npos) break;
    const std::string_view rest = xml.substr(lt);
    if (rest.starts_with("<?")) {
      const std::size_t end = xml.find("?>", lt);
      if (end == std::string_view::npos) return std::unexpected("unterminated <?...?>");
      pos = end + 2;
    } else if (rest.starts_with("<!--")) {
      const std::size_t end = xml.find("-->", lt);
      if (end == std::string_view::npos) return std::unexpected("unterminated comment");
      pos = end + 3;
    } else if (rest.starts_with("<![CDATA[")) {
      const std::size_t end = xml.find("]]>", lt);
      if (end == std::string_view::npos) return std::unexpected("unterminated CDATA section");
      if (!texts.empty()) texts.back() += xml.substr(lt + 9, end - lt - 9);
      pos = end + 3;
    } else if (rest.starts_with("<!")) {
      const std::size_t end = xml.find('>', lt);
      if (end == std::string_view::npos) return std::unexpected("unterminated <!...>");
      pos = end + 1;
    } else {
      const std::size_t gt = tagEnd(xml, lt);
      if (gt == std::string_view::npos) return std::unexpected("unterminated tag");
      std::string_view tag = xml.substr(lt + 1, gt - lt - 1);
      pos = gt + 1;
      const bool closing = tag.starts_with('/');
      const bool self_closing = !closing && tag.ends_with('/');
      if (closing) tag.remove_prefix(1);
      if (self_closing) tag.remove_suffix(1);
      const std::string_view name = tag.substr(0, tag.find_first_of(" \t\r\n"));
      if (name.empty()) return std::unexpected("a tag without a name");
      if (closing) {
        const std::size_t slash = path.rfind('/');
        const std::string_view open =
            std::string_view(path).substr(slash == std::string::npos ? 0 : slash + 1);
        if (texts.empty() || open != name) {
          return std::unexpected(fmt::format("</{}> closes no open <{}>", name, name));
        }
        on_element(path, texts.back());
        texts.pop_back();
        path.resize(slash == std::string::npos ? 0 : slash);
      } else {
        if (!path.empty()) path += '/';
        path += name;
        texts.emplace_back();
        if (self_closing) {
          on_element(path, "");
          texts.pop_back();
          const std::size_t slash = path.rfind('/');
          path.resize(slash == std::string::npos ? 0 : slash);
        }
      }
    }
  }
  if (!texts.empty()) return std::unexpected(fmt::format("<{}> is never closed", path));
  return {};
}

}  // namespace

std::expected<std::string, std::string> decodeText(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  std::size_t pos = 0;
  while (true) {
    const std::size_t amp = text.find('&', pos);
    out += text.substr(pos, amp == std::string_view::npos ? std::string_view::npos : amp - pos);
    if (amp == std::string_view::npos) return out;
    const std::size_t semicolon = text.find(';', amp);
    if (semicolon == std::string_view::npos) {
      return std::unexpected(fmt::format("unterminated reference at byte {}", amp));
    }
    const std::string_view entity = text.substr(amp + 1, semicolon - amp - 1);
    if (entity == "amp") {
      out += '&';
    } else if (entity == "lt") {
      out += '<';
    } else if (entity == "gt") {
      out += '>';
    } else if (entity == "quot") {
      out += '"';
    } else if (entity == "apos") {
      out += '\'';
    } else if (entity.starts_with('#')) {
      const bool hex = entity.starts_with("#x") || entity.starts_with("#X");
      const std::string_view digits = entity.substr(hex ? 2 : 1);
      uint32_t code_point = 0;
      const auto [end, ec] =
          std::from_chars(digits.data(), digits.data() + digits.size(), code_point, hex ? 16 : 10);
      if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() ||
          code_point == 0 || code_point > 0x10ffff ||
          (code_point >= 0xd800 && code_point <= 0xdfff)) {
        return std::unexpected(fmt::format("bad character reference &{};", entity));
      }
      appendUtf8(out, code_point);
    } else {
      return std::unexpected(fmt::format("unknown entity &{};", entity));
    }
    pos = semicolon + 1;
  }
}

std::optional<ErrorBody> parseError(std::string_view xml) {
  ErrorBody body;
  bool is_error = false;
  auto walked = walkElements(xml, [&](std::string_view path, std::string_view text) {
    if (path == "Error") is_error = true;
    if (path == "Error/Code") body.code = text;
    if (path == "Error/Message") body.message = text;
  });
  if (!walked || !is_error) return std::nullopt;
  return body;
}

std::expected<ListPage, std::string> parseListPage(std::string_view xml) {
  ListPage page;
  bool is_list = false;
  std::string truncated;
  auto walked = walkElements(xml, [&](std::string_view path, std::string_view text) {
    if (path == "ListBucketResult") is_list = true;
    if (path == "ListBucketResult/Contents/Key") page.keys.emplace_back(text);
    if (path == "ListBucketResult/IsTruncated") truncated = text;
    if (path == "ListBucketResult/NextContinuationToken") page.next_continuation_token = text;
  });
  if (!walked) return std::unexpected("malformed XML: " + walked.error());
  if (!is_list) return std::unexpected("not a ListBucketResult");
  if (truncated != "true" && truncated != "false") {
    return std::unexpected(fmt::format("IsTruncated is '{}', not true or false", truncated));
  }
  page.truncated = truncated == "true";
  if (page.truncated && page.next_continuation_token.empty()) {
    return std::unexpected("a truncated page without a NextContinuationToken");
  }
  return page;
}

}  // namespace rtable::backup::s3xml
