#include "rtable/operator/kube_config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>

namespace rtable::op {
namespace {

namespace fs = std::filesystem;

// "hello" and two PEM-looking payloads, base64-encoded.
constexpr const char* kCaData = "Q0EtUEVN";        // "CA-PEM"
constexpr const char* kCertData = "Q0VSVC1QRU0=";  // "CERT-PEM"
constexpr const char* kKeyData = "S0VZLVBFTQ==";   // "KEY-PEM"

class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "rtable-kubeconfig-XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  fs::path write(const std::string& name, const std::string& text) const {
    const fs::path p = path_ / name;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p;
  }

 private:
  fs::path path_;
};

TEST(KubeConfigTest, InlineDataAndToken) {
  const std::string yaml = std::string(R"(
apiVersion: v1
kind: Config
clusters:
- name: prod
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: )") +
                           kCaData + R"(
users:
- name: admin
  user:
    client-certificate-data: )" +
                           kCertData + R"(
    client-key-data: )" + kKeyData +
                           R"(
- name: robot
  user:
    token: abc.def
contexts:
- name: prod-admin
  context: {cluster: prod, user: admin, namespace: tables}
- name: prod-robot
  context: {cluster: prod, user: robot}
current-context: prod-admin
)";
  auto config = KubeConfig::parse(yaml, "/x/config");
  ASSERT_TRUE(config) << config.error().toString();
  EXPECT_EQ(config->currentContext(), "prod-admin");
  EXPECT_EQ(config->contextNames(), (std::vector<std::string>{"prod-admin", "prod-robot"}));

  auto admin = config->clusterConfig();
  ASSERT_TRUE(admin) << admin.error().toString();
  EXPECT_EQ(admin->server, "https://10.0.0.1:6443");  // trailing slash dropped
  EXPECT_EQ(admin->ca_pem, "CA-PEM");
  EXPECT_EQ(admin->client_certificate_pem, "CERT-PEM");
  EXPECT_EQ(admin->client_key_pem, "KEY-PEM");
  EXPECT_EQ(admin->bearer_token, "");
  EXPECT_EQ(admin->ns, "tables");
  EXPECT_FALSE(admin->insecure_skip_tls_verify);

  auto robot = config->clusterConfig("prod-robot");
  ASSERT_TRUE(robot) << robot.error().toString();
  EXPECT_EQ(robot->bearer_token, "abc.def");
  EXPECT_EQ(robot->ns, "default");
  EXPECT_TRUE(robot->client_certificate_pem.empty());
}

TEST(KubeConfigTest, FilesRelativeToTheKubeconfigFolder) {
  TempDir dir;
  dir.write("pki/ca.crt", "FILE-CA");
  dir.write("pki/client.crt", "FILE-CERT");
  dir.write("pki/client.key", "FILE-KEY");
  dir.write("secrets/token", "file-token\n");
  const fs::path file = dir.write("conf/../kubeconfig", R"(
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: pki/ca.crt
    insecure-skip-tls-verify: true
users:
- name: certs
  user:
    client-certificate: pki/client.crt
    client-key: )" + (dir.path() / "pki/client.key").string() +
                                                            R"(
- name: tokenfile
  user:
    token: ignored-while-the-file-is-readable
    tokenFile: secrets/token
contexts:
- name: certs
  context: {cluster: local, user: certs}
- name: tokenfile
  context: {cluster: local, user: tokenfile}
current-context: certs
)");
  auto config = KubeConfig::load(file);
  ASSERT_TRUE(config) << config.error().toString();
  auto certs = config->clusterConfig();
  ASSERT_TRUE(certs) << certs.error().toString();
  EXPECT_EQ(certs->ca_pem, "FILE-CA");
  EXPECT_TRUE(certs->insecure_skip_tls_verify);
  EXPECT_EQ(certs->client_certificate_pem, "FILE-CERT");
  EXPECT_EQ(certs->client_key_pem, "FILE-KEY");

  auto token = config->clusterConfig("tokenfile");
  ASSERT_TRUE(token) << token.error().toString();
  EXPECT_EQ(token->bearer_token, "file-token");
  ASSERT_TRUE(token->token_file);
  EXPECT_EQ(token->token_file->filename(), "token");
}

TEST(KubeConfigTest, DataWinsOverFile) {
  auto config = KubeConfig::parse(std::string(R"(
clusters:
- name: c
  cluster:
    server: https://h
    certificate-authority: /does/not/exist
    certificate-authority-data: )") + kCaData +
                                      R"(
contexts:
- name: x
  context: {cluster: c}
current-context: x
)",
                                  "/k/config");
  ASSERT_TRUE(config);
  auto cluster = config->clusterConfig();
  ASSERT_TRUE(cluster) << cluster.error().toString();
  EXPECT_EQ(cluster->ca_pem, "CA-PEM");
}

// Each error names the file and the field.
struct ErrorCase {
  const char* name;
  std::string yaml;
  std::string field;
  std::string message_part;
};

class KubeConfigErrorTest : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(KubeConfigErrorTest, NamesFileAndField) {
  const ErrorCase& c = GetParam();
  auto config = KubeConfig::parse(c.yaml, "/etc/kube/config");
  std::optional<KubeConfigError> error;
  if (!config) {
    error = config.error();
  } else {
    auto cluster = config->clusterConfig();
    ASSERT_FALSE(cluster) << "expected an error for " << c.name;
    error = cluster.error();
  }
  EXPECT_EQ(error->field, c.field) << error->toString();
  EXPECT_NE(error->message.find(c.message_part), std::string::npos) << error->toString();
  EXPECT_NE(error->toString().find(c.field), std::string::npos);
  EXPECT_EQ(error->file, "/etc/kube/config");
}

const std::string kGoodTail = R"(
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
)";

INSTANTIATE_TEST_SUITE_P(
    Fields, KubeConfigErrorTest,
    ::testing::Values(
        ErrorCase{"bad_yaml", "clusters: [", "", "not valid YAML"},
        ErrorCase{"bad_base64",
                  "clusters:\n- name: c\n  cluster:\n    server: https://h\n"
                  "    certificate-authority-data: '!!notbase64'\n" +
                      kGoodTail,
                  "clusters[\"c\"].cluster.certificate-authority-data", "base64"},
        ErrorCase{"missing_server",
                  "clusters:\n- name: c\n  cluster: {}\nusers:\n- name: u\n  user: {token: t}\n" +
                      kGoodTail,
                  "clusters[\"c\"].cluster.server", "missing"},
        ErrorCase{
            "missing_ca_file",
            "clusters:\n- name: c\n  cluster:\n    server: https://h\n"
            "    certificate-authority: nope/ca.crt\nusers:\n- name: u\n  user: {token: t}\n" +
                kGoodTail,
            "clusters[\"c\"].cluster.certificate-authority", "/etc/kube/nope/ca.crt"},
        ErrorCase{"bad_bool",
                  "clusters:\n- name: c\n  cluster:\n    server: https://h\n"
                  "    insecure-skip-tls-verify: maybe\n" +
                      kGoodTail,
                  "clusters[\"c\"].cluster.insecure-skip-tls-verify", "bad value"},
        ErrorCase{"unknown_user",
                  "clusters:\n- name: c\n  cluster: {server: https://h}\n" + kGoodTail,
                  "contexts[\"x\"].context.user", "user \"u\" not found"},
        ErrorCase{"unknown_context",
                  "clusters:\n- name: c\n  cluster: {server: https://h}\ncurrent-context: y\n",
                  "current-context", "context \"y\" not found"},
        ErrorCase{"exec_plugin",
                  "clusters:\n- name: c\n  cluster: {server: https://h}\nusers:\n- name: u\n"
                  "  user:\n    exec: {command: aws}\n" +
                      kGoodTail,
                  "users[\"u\"].user.exec", "not supported"},
        ErrorCase{"cert_without_key",
                  "clusters:\n- name: c\n  cluster: {server: https://h}\nusers:\n- name: u\n"
                  "  user:\n    client-certificate-data: " +
                      std::string(kCertData) + "\n" + kGoodTail,
                  "users[\"u\"].user.client-key", "both"},
        ErrorCase{"entry_without_name", "clusters:\n- cluster: {server: https://h}\n",
                  "clusters[0].name", "missing"},
        ErrorCase{"not_a_url",
                  "clusters:\n- name: c\n  cluster: {server: 'h:6443'}\nusers:\n- name: u\n"
                  "  user: {token: t}\n" +
                      kGoodTail,
                  "clusters[\"c\"].cluster.server", "not an http(s) URL"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(KubeConfigTest, MergedFilesFirstDefinitionWins) {
  TempDir dir;
  const fs::path first = dir.write("a", R"(
clusters:
- name: c
  cluster: {server: https://first}
contexts:
- name: x
  context: {cluster: c}
)");
  const fs::path second = dir.write("b", R"(
clusters:
- name: c
  cluster: {server: https://second}
- name: d
  cluster: {server: https://d}
contexts:
- name: y
  context: {cluster: d}
current-context: y
)");
  auto config = KubeConfig::loadMerged({first, dir.path() / "missing", second});
  ASSERT_TRUE(config) << config.error().toString();
  EXPECT_EQ(config->currentContext(), "y");  // the first file does not set it
  EXPECT_EQ(config->clusterConfig("x")->server, "https://first");
  EXPECT_EQ(config->clusterConfig()->server, "https://d");

  auto none = KubeConfig::loadMerged({dir.path() / "missing"});
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no kubeconfig"), std::string::npos);
}

TEST(InClusterConfigTest, ReadsServiceAccount) {
  TempDir dir;
  dir.write("sa/token", "sa-token\n");
  dir.write("sa/ca.crt", "SA-CA");
  dir.write("sa/namespace", "rtable-system");
  ConfigEnvironment env;
  env.service_host = "10.96.0.1";
  env.service_port = "443";
  env.service_account_dir = dir.path() / "sa";
  auto config = inClusterConfig(env);
  ASSERT_TRUE(config) << config.error().toString();
  EXPECT_EQ(config->server, "https://10.96.0.1:443");
  EXPECT_EQ(config->bearer_token, "sa-token");
  EXPECT_EQ(config->ca_pem, "SA-CA");
  EXPECT_EQ(config->ns, "rtable-system");
  EXPECT_TRUE(config->token_file);

  env.service_host = "fd00::1";
  EXPECT_EQ(inClusterConfig(env)->server, "https://[fd00::1]:443");

  fs::remove(dir.path() / "sa/token");
  auto missing = inClusterConfig(env);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().file.find("sa/token"), std::string::npos);
}

TEST(LoadDefaultConfigTest, Precedence) {
  TempDir dir;
  const std::string one =
      "clusters:\n- name: c\n  cluster: {server: https://from-kubeconfig}\n"
      "contexts:\n- name: x\n  context: {cluster: c}\ncurrent-context: x\n";
  const fs::path explicit_file = dir.write("explicit", one);
  dir.write("home/.kube/config",
            "clusters:\n- name: c\n  cluster: {server: https://from-home}\n"
            "contexts:\n- name: x\n  context: {cluster: c}\ncurrent-context: x\n");
  dir.write("sa/token", "t");
  dir.write("sa/ca.crt", "CA");

  ConfigEnvironment env;
  env.home = dir.path() / "home";
  env.service_account_dir = dir.path() / "sa";

  // Only ~/.kube/config.
  EXPECT_EQ(loadDefaultConfig(env)->server, "https://from-home");
  // In a cluster: the service account beats ~/.kube/config.
  env.service_host = "10.0.0.1";
  env.service_port = "443";
  EXPECT_EQ(loadDefaultConfig(env)->server, "https://10.0.0.1:443");
  // $KUBECONFIG beats both.
  env.kubeconfig = explicit_file.string();
  EXPECT_EQ(loadDefaultConfig(env)->server, "https://from-kubeconfig");

  // Nothing at all.
  ConfigEnvironment empty;
  empty.home = dir.path() / "nohome";
  auto none = loadDefaultConfig(empty);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message.find("no cluster configuration"), std::string::npos);
}

}  // namespace
}  // namespace rtable::op
