// A replica whose data volume fills (a small tmpfs the test mounts, and always unmounts), under a
// writer that retries every insert with its insert_deduplication_token on the other replica:
// the full replica refuses inserts with 507 naming the cause and stays up; nothing acknowledged is
// lost; once space returns it converges with its peer (same parts, every acknowledged row exactly
// once) within a stated time. RTABLE_DISK_FULL_RUNS=N repeats the scenario N times (a soak) and
// reports how many runs converged and how long each took from space returned to converged.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "replication_cluster.h"

namespace rtable::core {
namespace {

using common::testing::waitFor;
using nlohmann::json;
using testing::LocalReplica;
using namespace std::chrono_literals;

constexpr std::size_t kRowBytes = 24 << 10;  // about the rows of the report in issue 26
constexpr auto kConvergeWithin = std::chrono::seconds(120);

// A value zstd cannot shrink much, different for every id.
std::string filler(uint64_t id) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string text(kRowBytes, ' ');
  uint64_t x = id * 0x9E3779B97F4A7C15ull + 1;
  for (auto& c : text) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = kAlphabet[x & 63];
  }
  return text;
}

class DiskFull : public ReplicationCluster {
 protected:
  void TearDown() override {
    replicas_.clear();  // stopped before their volume goes
    for (const auto& dir : mounted_) ::umount2(dir.c_str(), MNT_DETACH);
    if (!base_dir_.empty()) work_dir_ = base_dir_;
    ReplicationCluster::TearDown();
  }

  // A tmpfs of `bytes` at `dir`, unmounted by TearDown whatever happens.
  void mountSmallVolume(const std::filesystem::path& dir, std::size_t bytes) {
    ASSERT_EQ(::geteuid(), 0u) << "mounting a small tmpfs needs root (CI runs as root)";
    std::filesystem::create_directories(dir);
    ASSERT_EQ(::mount("tmpfs", dir.c_str(), "tmpfs", 0, fmt::format("size={}", bytes).c_str()), 0)
        << "mount tmpfs on " << dir << ": " << std::strerror(errno);
    mounted_.push_back(dir);
  }

  struct Outcome {
    bool ok = false;
    int status = 0;
    std::string body;
  };
  Outcome insertOnce(LocalReplica& replica, uint64_t id) {
    const std::string body =
        fmt::format(R"({{"id":{},"d":"2026-12-0{}","user":"{}"}})", id, 1 + id % 9, filler(id)) +
        "\n";
    auto response = replica.post(
        fmt::format("/insert?format=JSONEachRow&insert_deduplication_token=t{}", id), body);
    if (!response) return Outcome{false, 0, response.error()};
    return Outcome{response->status == 200, response->status, response->body};
  }

  // Inserts `id` on `first`, retrying on the other replica (and back) until one acknowledges it.
  void insertRetrying(LocalReplica& first, LocalReplica& other, uint64_t id) {
    LocalReplica* targets[] = {&first, &other};
    for (int attempt = 0; attempt < 200; ++attempt) {
      LocalReplica& target = *targets[attempt % 2];
      Outcome outcome = insertOnce(target, id);
      if (outcome.ok) {
        std::lock_guard lock(mu_);
        acknowledged_.insert(id);
        return;
      }
      if (outcome.status == 507) {
        ++refused_full_;
        EXPECT_NE(outcome.body.find("INSUFFICIENT_STORAGE"), std::string::npos) << outcome.body;
        EXPECT_NE(outcome.body.find("No space left on device"), std::string::npos) << outcome.body;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ADD_FAILURE() << "insert " << id << " was never acknowledged";
  }

  // Every id on the replica, and how many rows carry one.
  std::multiset<uint64_t> idsOn(LocalReplica& replica) {
    std::multiset<uint64_t> ids;
    auto selected = replica.get("/select?format=TSV");
    EXPECT_TRUE(selected && selected->status == 200);
    if (!selected || selected->status != 200) return ids;
    for (std::size_t start = 0; start < selected->body.size();) {
      const std::size_t end = selected->body.find('\n', start);
      ids.insert(
          std::stoull(selected->body.substr(start, selected->body.find('\t', start) - start)));
      start = end == std::string::npos ? selected->body.size() : end + 1;
    }
    return ids;
  }

  // Two clients at once, as in issue 26's report: ids `first`, `first + 2`, ... up to `end`, each
  // started on r2 and r1 in turn, until `stop` says enough.
  void twoClients(LocalReplica& r1, LocalReplica& r2, uint64_t first, uint64_t end,
                  const std::function<bool()>& stop) {
    std::vector<std::thread> clients;
    for (uint64_t client = 0; client < 2; ++client) {
      clients.emplace_back([&, client] {
        for (uint64_t id = first + client; id < end && !stop(); id += 2) {
          const bool on_r2 = (id / 2) % 2 == 0;
          insertRetrying(on_r2 ? r2 : r1, on_r2 ? r1 : r2, id);
        }
      });
    }
    for (auto& client : clients) client.join();
  }

  // The queue of /replica's answer in short: the executing counts, how many entries wait for
  // which reason, and the first few entries with their last error.
  static std::string summarizeState(const std::string& body) {
    json state = json::parse(body, nullptr, false);
    if (state.is_discarded()) return body.substr(0, 2000);
    std::map<std::string, int> waiting;
    std::string first;
    int shown = 0;
    for (const auto& entry : state["queue"]) {
      ++waiting[fmt::format("{}/{}", entry["type"].get<std::string>(),
                            entry["is_currently_executing"].get<bool>()
                                ? "executing"
                                : entry["postpone_reason"].get<std::string>())];
      if (shown++ < 4) {
        first +=
            fmt::format("\n  {} {} tries {}: {} / {}", entry["type"].get<std::string>(),
                        entry["new_part_name"].get<std::string>(), entry["num_tries"].get<int>(),
                        entry["last_exception"].get<std::string>(),
                        entry["postpone_message"].get<std::string>());
      }
    }
    std::string counts;
    for (const auto& [what, n] : waiting) counts += fmt::format(" {}={}", what, n);
    return fmt::format("executing {}; postponed {}; queue{}{}", state["executing"].dump(),
                       state["postponed"].dump(), counts, first);
  }

  // What takes the volume's space, for a run that did not converge.
  static std::string volumeListing(const std::filesystem::path& volume) {
    std::map<std::string, uintmax_t> bytes;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(volume, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      auto top = std::filesystem::relative(it->path(), volume, ec).begin()->string();
      if (top.starts_with("20")) top = "parts";
      bytes[top] += it->file_size(ec);
    }
    struct statvfs fs{};
    std::string listing = "\nvolume:";
    if (::statvfs(volume.c_str(), &fs) == 0) {
      listing += fmt::format(" {} KiB free of {} KiB;", fs.f_bavail * fs.f_frsize >> 10,
                             fs.f_blocks * fs.f_frsize >> 10);
    }
    for (const auto& [top, size] : bytes) listing += fmt::format(" {} {} KiB", top, size >> 10);
    return listing;
  }

  std::filesystem::path base_dir_;
  std::vector<std::filesystem::path> mounted_;
  std::mutex mu_;
  std::set<uint64_t> acknowledged_;  // guarded by mu_
  std::atomic<std::size_t> refused_full_{0};
};

TEST_F(DiskFull, AFullReplicaRefusesInsertsClearlyAndConvergesOnceSpaceReturns) {
  int runs = 1;
  if (const char* soak = std::getenv("RTABLE_DISK_FULL_RUNS")) runs = std::max(1, std::atoi(soak));
  std::vector<double> seconds_to_converge;
  int converged_runs = 0;
  base_dir_ = work_dir_;
  for (int run = 0; run < runs; ++run) {
    replicas_.clear();
    acknowledged_.clear();
    refused_full_ = 0;
    table_ = fmt::format("DiskFull{}", run);
    work_dir_ = base_dir_ / fmt::format("run{}", run);
    const std::filesystem::path volume = work_dir_ / "r2" / "data";
    // Ballast takes all of it at first. Once the ballast goes, 96 MiB holds what the fill phase can
    // bring (at most 1000 rows of 24 KiB: 18 MiB merged, but up to 50 MiB as single-row parts,
    // whose small files take a page each), the journal's two 4 MiB files and a merge's output
    // beside its sources. A volume that cannot hold the table even then tests nothing about
    // liveness: 24 MiB did not in one CI run (600 rows, 321 parts), and nothing could converge.
    mountSmallVolume(volume, 96 << 20);
    if (HasFatalFailure()) return;
    auto& r1 = addReplica("r1");
    auto& r2 = addReplica("r2");
    // The rest of the volume taken by something else. r2 still takes inserts into the journal
    // file it has preallocated (4 MiB), then refuses them.
    const std::filesystem::path ballast = volume / "ballast";
    {
      std::ofstream out(ballast, std::ios::binary);
      const std::string kib(1 << 10, 'x');
      while (out.write(kib.data(), kib.size()) && out.flush()) {
      }
    }
    twoClients(r1, r2, 0, 1000, [&] { return refused_full_ >= 5; });
    EXPECT_GE(refused_full_, 5u) << "r2's volume never filled";
    // r2 stayed up and says why it refuses.
    auto ready = r2.get("/replica");
    ASSERT_TRUE(ready) << ready.error();
    EXPECT_EQ(ready->status, 200);
    // ... and says so in ZooKeeper, where the operator reads it for the table's status.
    auto keeper = zookeeper().connect();
    ASSERT_TRUE(keeper) << keeper.error().toString();
    const std::string disk_full = fmt::format("/rtable/tables/{}/1/replicas/r2/disk_full", table_);
    KeeperResult<GetResult> said = std::unexpected(KeeperError{});
    EXPECT_TRUE(waitFor([&] { return (said = (*keeper)->get(disk_full)).has_value(); }, 15s))
        << "r2 never published " << disk_full;
    if (said) std::printf("r2's %s: %s\n", disk_full.c_str(), said->data.c_str());

    std::filesystem::remove(ballast);
    const auto freed = std::chrono::steady_clock::now();
    twoClients(r1, r2, 10'000, 10'040, [] { return false; });
    std::optional<ReplicaContents> c1, c2;
    const bool converged = waitFor(
        [&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          c1 = contents(r1);
          c2 = contents(r2);
          return c1 && c2 && c1->queue_size == 0 && c2->queue_size == 0 && *c1 == *c2 &&
                 c1->rows == acknowledged_.size();
        },
        kConvergeWithin);
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - freed).count();
    auto state = r2.get("/replica");
    EXPECT_TRUE(converged)
        << fmt::format(
               "run {}: not converged {:.1f} s after space returned: r1 {} rows, r2 {} rows, {} "
               "acknowledged; "
               "r2's state: {}",
               run + 1, took, c1 ? c1->rows : 0, c2 ? c2->rows : 0, acknowledged_.size(),
               state ? summarizeState(state->body) : state.error())
        << volumeListing(volume);
    // A part written again: the node goes.
    EXPECT_TRUE(waitFor(
        [&] {
          auto node = (*keeper)->exists(disk_full);
          return node && !node->has_value();
        },
        20s))
        << disk_full << " stayed after space returned";
    // Every acknowledged row exactly once, on both.
    const std::multiset<uint64_t> expected(acknowledged_.begin(), acknowledged_.end());
    EXPECT_EQ(idsOn(r1), expected);
    EXPECT_EQ(idsOn(r2), expected);
    if (converged) {
      ++converged_runs;
      seconds_to_converge.push_back(took);
    }
  }
  std::sort(seconds_to_converge.begin(), seconds_to_converge.end());
  if (!seconds_to_converge.empty()) {
    std::printf(
        "disk full: %d of %d runs converged; from space returned to converged: p50 %.1f s, max "
        "%.1f s\n",
        converged_runs, runs, seconds_to_converge[seconds_to_converge.size() / 2],
        seconds_to_converge.back());
  }
}

}  // namespace
}  // namespace rtable::core
