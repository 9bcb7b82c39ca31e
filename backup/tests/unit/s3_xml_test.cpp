// The XML reader S3Storage uses (backup/src/s3_xml.h), on answers shaped like AWS S3's and
// SeaweedFS's, and on what a minimal parser gets wrong: references, CDATA, attributes holding
// '>', nesting.
#include "s3_xml.h"

#include <gtest/gtest.h>

namespace rtable::backup::s3xml {
namespace {

TEST(S3XmlTest, DecodesEntityAndCharacterReferences) {
  EXPECT_EQ(decodeText("a &amp; b &lt;c&gt; &quot;d&quot; &apos;e&apos;").value_or("error"),
            "a & b <c> \"d\" 'e'");
  EXPECT_EQ(decodeText("&#65;&#x42;&#X43;&#233;&#x6570;&#x1F600;").value_or("error"), "ABCé数😀");
  EXPECT_FALSE(decodeText("&nbsp;"));
  EXPECT_FALSE(decodeText("a & b"));
  EXPECT_FALSE(decodeText("&#xD800;"));
  EXPECT_FALSE(decodeText("&#0;"));
  EXPECT_FALSE(decodeText("&#x110000;"));
  EXPECT_FALSE(decodeText("&#12a;"));
}

TEST(S3XmlTest, ParsesAnErrorBody) {
  auto error = parseError(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SignatureDoesNotMatch</Code>"
      "<Message>The request signature we calculated does not match the signature you provided. "
      "Check your key &amp; signing method.</Message><Resource>/b/k</Resource>"
      "<RequestId>1</RequestId></Error>");
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code, "SignatureDoesNotMatch");
  EXPECT_EQ(error->message,
            "The request signature we calculated does not match the signature you provided. "
            "Check your key & signing method.");
  EXPECT_FALSE(parseError(""));
  EXPECT_FALSE(parseError("<html><body>502 Bad Gateway</body></html>"));
  EXPECT_FALSE(parseError("<Error><Code>x</Code>"));  // cut short
}

TEST(S3XmlTest, ParsesAListPage) {
  auto page = parseListPage(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
      "<Name>bkt</Name><Prefix>p/</Prefix><KeyCount>3</KeyCount><MaxKeys>3</MaxKeys>"
      "<IsTruncated>true</IsTruncated>"
      "<Contents><Key>p/a &amp; b</Key><LastModified>2026-12-06T09:00:00Z</LastModified>"
      "<ETag>&quot;0cc175b9c0f1b6a831c399e269772661&quot;</ETag><Size>1</Size>"
      "<Owner><ID>x</ID><DisplayName>Key</DisplayName></Owner>"
      "<StorageClass>STANDARD</StorageClass></Contents>"
      "<Contents><Key>p/&lt;x&gt;</Key><Size>0</Size></Contents>"
      "<!-- a comment with <Key>not a key</Key> -->"
      "<Contents><Key><![CDATA[p/c<d>&e]]></Key></Contents>"
      "<NextContinuationToken>token+/=</NextContinuationToken>"
      "</ListBucketResult>");
  ASSERT_TRUE(page) << page.error();
  EXPECT_EQ(page->keys, (std::vector<std::string>{"p/a & b", "p/<x>", "p/c<d>&e"}));
  EXPECT_TRUE(page->truncated);
  EXPECT_EQ(page->next_continuation_token, "token+/=");
}

TEST(S3XmlTest, ParsesALastPageAndAnEmptyOne) {
  auto page = parseListPage(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>k</Key></Contents>"
      "</ListBucketResult>");
  ASSERT_TRUE(page) << page.error();
  EXPECT_EQ(page->keys, std::vector<std::string>{"k"});
  EXPECT_FALSE(page->truncated);
  page = parseListPage(
      "<ListBucketResult a='x>y' b=\"1\"><Name>b</Name><KeyCount>0</KeyCount><Delimiter/>"
      "<IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(page) << page.error();
  EXPECT_TRUE(page->keys.empty());
}

TEST(S3XmlTest, RefusesWhatIsNoListPage) {
  EXPECT_FALSE(parseListPage(""));
  EXPECT_FALSE(parseListPage("<Error><Code>NoSuchBucket</Code></Error>"));
  // Truncated, and nowhere to continue from.
  EXPECT_FALSE(
      parseListPage("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>"));
  EXPECT_FALSE(parseListPage("<ListBucketResult><IsTruncated>false</IsTruncated>"));
  EXPECT_FALSE(
      parseListPage("<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Contents>"
                    "</Key></ListBucketResult>"));
  EXPECT_FALSE(parseListPage(
      "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&bad;</Key></Contents>"
      "</ListBucketResult>"));
}

}  // namespace
}  // namespace rtable::backup::s3xml
