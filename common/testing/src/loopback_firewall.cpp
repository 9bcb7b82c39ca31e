#include "rtable/common/testing/loopback_firewall.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <regex>

namespace rtable::common::testing {
namespace {

constexpr std::string_view kPrefix = "rtable_test_";
constexpr auto kNftTimeout = std::chrono::seconds(20);

TestStatus nft(const std::string& command) {
  auto result = runCommand({"nft", command}, kNftTimeout);
  if (!result) return std::unexpected(fmt::format("nft {}: {}", command, result.error()));
  if (result->exit_code != 0) {
    return std::unexpected(fmt::format("nft {} failed (exit {}): {}{}", command, result->exit_code,
                                       result->out, result->err));
  }
  return {};
}

// Tables that test processes no longer alive left behind (killed before their destructor ran).
void deleteStaleTables() {
  auto listed = runCommand({"nft", "list", "tables", "inet"}, kNftTimeout);
  if (!listed || listed->exit_code != 0) return;
  static const std::regex kTable(R"(table inet (rtable_test_(\d+)_\d+))");
  for (auto it = std::sregex_iterator(listed->out.begin(), listed->out.end(), kTable);
       it != std::sregex_iterator(); ++it) {
    const pid_t owner = static_cast<pid_t>(std::stol((*it)[2].str()));
    if (::kill(owner, 0) != 0 && errno == ESRCH) (void)nft("delete table inet " + (*it)[1].str());
  }
}

}  // namespace

std::expected<std::unique_ptr<LoopbackFirewall>, std::string> LoopbackFirewall::create() {
  deleteStaleTables();
  static std::atomic<int> next{0};
  const std::string table = fmt::format("{}{}_{}", kPrefix, getpid(), next++);
  if (auto made = nft("add table inet " + table); !made) return std::unexpected(made.error());
  std::unique_ptr<LoopbackFirewall> firewall(new LoopbackFirewall(table));
  if (auto chain = nft(fmt::format(
          "add chain inet {} out {{ type filter hook output priority 0; policy accept; }}", table));
      !chain) {
    return std::unexpected(chain.error());
  }
  return firewall;
}

LoopbackFirewall::~LoopbackFirewall() {
  (void)nft("delete table inet " + table_);
}

TestStatus LoopbackFirewall::drop(const std::vector<uid_t>& uids, const std::vector<int>& ports) {
  if (uids.empty() || ports.empty()) return std::unexpected("drop needs uids and ports");
  // oifname lo: loopback packets only, whatever else the uid might send.
  return nft(
      fmt::format("add rule inet {} out oifname \"lo\" meta skuid {{ {} }} tcp dport {{ {} }} drop",
                  table_, fmt::join(uids, ", "), fmt::join(ports, ", ")));
}

TestStatus LoopbackFirewall::heal() {
  return nft(fmt::format("flush chain inet {} out", table_));
}

std::string LoopbackFirewall::describe() const {
  auto listed = runCommand({"nft", "list", "table", "inet", table_}, kNftTimeout);
  if (!listed) return listed.error();
  return listed->out + listed->err;
}

std::vector<uid_t> testUids(int count) {
  // 64 uids per pid slot; 2^16 slots above 1,000,000.
  const uid_t base = 1'000'000 + static_cast<uid_t>(getpid() % 65536) * 64;
  std::vector<uid_t> uids;
  for (int i = 0; i < count && i < 64; ++i) uids.push_back(base + static_cast<uid_t>(i));
  return uids;
}

}  // namespace rtable::common::testing
