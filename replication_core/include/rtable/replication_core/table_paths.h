// Where a table generation and its replicas live in ZooKeeper (DESIGN.md 2.2). Every path the core
// and the operator use is built here, so the layout is written down once.
//
//   <root>/active                                   the active generation (the table swap sets it)
//   <root>/<generation>/{metadata, columns, log, block_numbers, deduplication_hashes, quorum,
//                        leader_election, temp, replicas}
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace rtable::core {

struct TablePaths {
  std::string table_root;  // /rtable/tables/<table-uid>
  int64_t generation = 1;
  std::string replica;  // this replica's name

  std::string activeGeneration() const { return table_root + "/active"; }
  std::string generationRoot() const { return table_root + "/" + std::to_string(generation); }
  std::string metadata() const { return generationRoot() + "/metadata"; }
  std::string columns() const { return generationRoot() + "/columns"; }
  std::string log() const { return generationRoot() + "/log"; }
  std::string logEntryPrefix() const { return log() + "/log-"; }
  std::string blockNumbers() const { return generationRoot() + "/block_numbers"; }
  std::string blockNumbers(const std::string& partition) const {
    return blockNumbers() + "/" + partition;
  }
  std::string blockLockPrefix(const std::string& partition) const {
    return blockNumbers(partition) + "/block-";
  }
  std::string dedupHashes() const { return generationRoot() + "/deduplication_hashes"; }
  std::string dedupHash(const std::string& id) const { return dedupHashes() + "/" + id; }
  std::string quorum() const { return generationRoot() + "/quorum"; }
  std::string quorumParallel() const { return quorum() + "/parallel"; }
  std::string quorumParallel(const std::string& part) const {
    return quorumParallel() + "/" + part;
  }
  std::string leaderElection() const { return generationRoot() + "/leader_election"; }
  std::string temp() const { return generationRoot() + "/temp"; }
  std::string replicas() const { return generationRoot() + "/replicas"; }

  std::string replicaRoot(const std::string& name) const { return replicas() + "/" + name; }
  std::string replicaRoot() const { return replicaRoot(replica); }
  std::string host() const { return replicaRoot() + "/host"; }
  std::string isActive() const { return replicaRoot() + "/is_active"; }
  std::string isLost() const { return replicaRoot() + "/is_lost"; }
  // Ephemeral, while the replica's data volume is full (ReplicationWorker::noteOutOfSpace).
  std::string diskFull() const { return replicaRoot() + "/disk_full"; }
  std::string logPointer() const { return replicaRoot() + "/log_pointer"; }
  std::string queue() const { return replicaRoot() + "/queue"; }
  std::string parts() const { return replicaRoot() + "/parts"; }
  std::string part(const std::string& name) const { return parts() + "/" + name; }
  // Small parts this replica committed and has not yet written out: their bytes, until its next
  // checkpoint (TableReplica, "part images" in docs/formats.md).
  std::string partImages() const { return replicaRoot() + "/part_images"; }
  std::string partImage(const std::string& name) const { return partImages() + "/" + name; }
};

// Where a generation's parts and journal live under the replica's data directory: generation 1
// in the directory itself (as before generations could change, so existing volumes keep working),
// a later one in `generation-<g>/` inside it, beside the generation it replaces.
inline std::filesystem::path generationDataDir(const std::filesystem::path& data_dir,
                                               int64_t generation) {
  return generation == 1 ? data_dir : data_dir / ("generation-" + std::to_string(generation));
}
inline constexpr const char* kGenerationDirPrefix = "generation-";

}  // namespace rtable::core
