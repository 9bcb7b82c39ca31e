// The little of S3's XML that S3Storage reads: error bodies and ListObjectsV2 pages. A small
// reader of well-formed XML (elements, attributes, character and entity references, CDATA,
// comments, the declaration), not a validating parser. Private to rtable::backup; pure functions.
#pragma once

#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rtable::backup::s3xml {

// Text with its entity and character references replaced (&amp; &lt; &gt; &quot; &apos; &#N;
// &#xN;, the last two as UTF-8). An unknown or unterminated reference is an error.
std::expected<std::string, std::string> decodeText(std::string_view text);

// <Error><Code>...</Code><Message>...</Message>...</Error>; nullopt when `xml` is not that.
struct ErrorBody {
  std::string code;     // "SignatureDoesNotMatch"
  std::string message;  // "The request signature we calculated does not match ..."
};
std::optional<ErrorBody> parseError(std::string_view xml);

// One page of ListObjectsV2 (ListBucketResult): the keys in the order given, and where the next
// page starts.
struct ListPage {
  std::vector<std::string> keys;
  bool truncated = false;
  std::string next_continuation_token;
};
std::expected<ListPage, std::string> parseListPage(std::string_view xml);

}  // namespace rtable::backup::s3xml
