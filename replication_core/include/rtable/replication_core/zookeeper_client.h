// The real Keeper, on ZooKeeper's C client (libzookeeper_mt).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rtable/replication_core/keeper.h"

namespace rtable::core {

struct ZooKeeperConfig {
  std::string connect_string;  // "host:port[,host:port...][/chroot]"
  // Defaults from ClickHouse (zkutil DEFAULT_SESSION_TIMEOUT = 30000 ms).
  std::chrono::milliseconds session_timeout{30000};
  std::chrono::milliseconds connect_timeout{10000};
};

// Identifies a session to the server; with it a second client can attach to (and so close) the
// session, which is how tests expire a session on a real server.
struct SessionCredentials {
  int64_t session_id = 0;
  std::string password;  // 16 raw bytes
};

class ZooKeeperClient : public Keeper {
 public:
  // Connects and waits until the session is established or `connect_timeout` passes
  // (kConnectionLoss, with the servers named in the detail).
  static KeeperResult<std::unique_ptr<ZooKeeperClient>> connect(const ZooKeeperConfig& config);

  virtual SessionCredentials sessionCredentialsForTest() const = 0;

  // The C client logs every failed connection attempt to stderr. A command-line tool that reports
  // errors itself turns that off (process-wide).
  static void silenceLibraryLog();
};

}  // namespace rtable::core
