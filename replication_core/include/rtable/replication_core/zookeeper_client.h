// The real Keeper, on ZooKeeper's C client (libzookeeper_mt).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rtable/replication_core/keeper.h"

namespace rtable::core {

// A ZooKeeper "digest" identity (user:password) and the subtree it owns. The session adds it at
// connect (the C client sends it again after a reconnect), and every node this client creates
// at `subtree` or below gets an ACL granting all permissions to this identity and nobody else:
// a client without it can neither read nor change the node, nor create or delete its children.
// Nodes created above every subtree (shared parents such as /rtable/tables) stay open to all,
// so that other tables can create their own subtrees beside it.
struct ZooKeeperDigest {
  std::string user;
  std::string password;
  std::string subtree;  // "/rtable/tables/<uid>"
  // During a rotation of the password (docs/security.md): the session authenticates with this
  // one too, and the ACL of new nodes names both, so that replicas with either keep access.
  std::string previous_password = {};

  friend bool operator==(const ZooKeeperDigest&, const ZooKeeperDigest&) = default;
};

// The ACL id of a digest identity, as ZooKeeper stores it: "user:base64(sha1(user:password))".
std::string digestAclId(const std::string& user, const std::string& password);
// The ids a digest identity's nodes name: its password's and, during a rotation, its previous
// password's.
std::vector<std::string> digestAclIds(const ZooKeeperDigest& digest);

// A subtree that several tables' identities share: a cluster backup's operation node and
// everything below it (backup/backup_operation.h). Nodes this client creates there get every
// permission for each of `ids` (digestAclIds of the tables: naming an id needs no password) and
// read for anyone: a replica deleting a backup's data must see whether a backup of another table
// is writing to the same destination (backup_deletion.h). Metadata only: names, sizes,
// checksums, where a backup goes; never rows or credentials.
struct SharedSubtree {
  std::string subtree;
  std::vector<std::string> ids;

  friend bool operator==(const SharedSubtree&, const SharedSubtree&) = default;
};

struct ZooKeeperConfig {
  std::string connect_string;  // "host:port[,host:port...][/chroot]"
  // Defaults from ClickHouse (zkutil DEFAULT_SESSION_TIMEOUT = 30000 ms).
  std::chrono::milliseconds session_timeout{30000};
  std::chrono::milliseconds connect_timeout{10000};
  // Identities of this session; a create takes the ACL of the deepest subtree holding its path.
  std::vector<ZooKeeperDigest> digests = {};
  // Subtrees shared by several identities, for a create below no identity's subtree.
  std::vector<SharedSubtree> shared_subtrees = {};
  // A create below none of the above, two or more levels below one of these roots, takes the ACL
  // of its ancestor one level below the root (read from ZooKeeper once per ancestor): a replica
  // holding one table's identity creates its nodes of a backup operation with the ACL the
  // operator gave the operation (<backups root>/backup-<uid>), whatever tables it names. Anything
  // else is created open to all.
  std::vector<std::string> inheriting_roots = {};
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

  // Adds an identity to this session (and to the sessions startNewSession makes): one session
  // serving many tables, as the operator's, learns each table's credential when it first meets
  // the table. A digest already held changes nothing; one for the same subtree with another
  // password is added and wins for new nodes (a rotation). Waits for ZooKeeper's answer.
  virtual KeeperStatus addDigest(const ZooKeeperDigest& digest) = 0;

  // Gives every node at `subtree` and below the ACL of the identity this session holds for that
  // subtree (added at connect or by addDigest), where it has another: the migration of a table
  // created before ACLs, whose nodes are open to all. Returns how many nodes changed. Nodes
  // created meanwhile by this identity already have it; one deleted meanwhile is skipped.
  virtual KeeperResult<std::size_t> restrictSubtree(const std::string& subtree) = 0;

  // The C client logs every failed connection attempt to stderr. A command-line tool that reports
  // errors itself turns that off (process-wide).
  static void silenceLibraryLog();
};

}  // namespace rtable::core
