#include "rtable/replication_core/replication_queue.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace rtable::core {
namespace {

using namespace std::chrono_literals;

PartName queuedPart(const std::string& name) {
  return *PartName::parse(name);
}

QueueEntry get(const std::string& node, const std::string& name) {
  QueueEntry e;
  e.node_name = node;
  e.entry.type = LogEntry::Type::kGetPart;
  e.entry.new_part_name = name;
  return e;
}

QueueEntry merge(const std::string& node, std::vector<std::string> sources,
                 const std::string& result) {
  QueueEntry e;
  e.node_name = node;
  e.entry.type = LogEntry::Type::kMergeParts;
  e.entry.source_parts = std::move(sources);
  e.entry.new_part_name = result;
  return e;
}

QueueEntry dropRange(const std::string& node, const std::string& range) {
  QueueEntry e;
  e.node_name = node;
  e.entry.type = LogEntry::Type::kDropRange;
  e.entry.new_part_name = range;
  return e;
}

// The replica's active parts, as the queue's owner would keep them.
class Replica {
 public:
  void add(const std::string& name) { (void)active.add(queuedPart(name)); }
  ReplicationQueue::LocalPartLookup lookup() const {
    return [this](const PartName& p) { return active.containingPart(p); };
  }
  std::vector<PartName> parts() const { return active.parts(); }
  ActiveDataPartSet active;
};

class Queue : public ::testing::Test {
 protected:
  std::optional<SelectedEntry> select() {
    return queue.selectEntryToProcess(replica.lookup(), false, now);
  }
  void expectInvariant() { EXPECT_EQ(queue.checkVirtualPartsInvariant(replica.parts()), ""); }
  // Executes what the selection asked for, as the replica would on success.
  void complete(const SelectedEntry& selected) {
    if (selected.action != QueueAction::kNothing) {
      replica.add(selected.entry.new_part_name);
      queue.addCurrentPart(queuedPart(selected.entry.new_part_name));
    }
    queue.finish(selected.node_name);
  }
  std::vector<std::string> order() const {
    std::vector<std::string> nodes;
    for (const auto& e : queue.entries()) nodes.push_back(e.node_name);
    return nodes;
  }

  ReplicationQueue queue{QueueLimits{.fetch_pool_size = 1, .merge_pool_size = 1}};
  Replica replica;
  QueueClock::time_point now = QueueClock::time_point{} + 1000s;
};

TEST_F(Queue, MergeWaitsForItsSourceWhileLaterEntriesRun) {
  replica.add("all_1_1_0");
  queue.addCurrentPart(queuedPart("all_1_1_0"));
  queue.insert(merge("q1", {"all_1_1_0", "all_2_2_0"}, "all_1_2_1"));
  queue.insert(get("q2", "all_2_2_0"));
  expectInvariant();
  EXPECT_EQ(queue.virtualParts().parts(), std::vector<PartName>{queuedPart("all_1_2_1")});

  // The merge cannot run (its source is still to be fetched): the fetch after it runs first.
  auto first = select();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->node_name, "q2");
  EXPECT_EQ(first->action, QueueAction::kFetch);
  ASSERT_EQ(queue.entries().front().node_name, "q1");
  EXPECT_EQ(queue.entries().front().num_postponed, 1u);
  EXPECT_EQ(queue.entries().front().postpone_reason, PostponeReason::kMergeSourceMissing);
  EXPECT_NE(queue.entries().front().postpone_message.find("part all_2_2_0 is not ready yet"),
            std::string::npos);
  EXPECT_EQ(queue.postponedCount(PostponeReason::kMergeSourceMissing), 1u);
  expectInvariant();

  // While the fetch runs, the merge (which covers the fetched part) waits for it.
  EXPECT_FALSE(select());
  EXPECT_EQ(queue.entries().front().postpone_reason, PostponeReason::kCoveredByFuturePart);
  complete(*first);
  expectInvariant();

  auto second = select();
  ASSERT_TRUE(second);
  EXPECT_EQ(second->node_name, "q1");
  EXPECT_EQ(second->action, QueueAction::kMerge);
  complete(*second);
  EXPECT_TRUE(queue.empty());
  expectInvariant();
}

TEST_F(Queue, ALostMergeResultLeavesTheSourcesHeldHereInTheVirtualParts) {
  // Only one source is here; the merge's result is to be fetched, and turns out lost forever.
  replica.add("all_1_1_0");
  queue.addCurrentPart(queuedPart("all_1_1_0"));
  queue.insert(merge("q1", {"all_1_1_0", "all_2_2_0"}, "all_1_2_1"));
  queue.insert(get("q2", "all_3_3_0"));
  EXPECT_EQ(queue.virtualParts().parts(),
            (std::vector<PartName>{queuedPart("all_1_2_1"), queuedPart("all_3_3_0")}));
  auto selected = select();
  ASSERT_TRUE(selected);
  EXPECT_EQ(selected->node_name, "q1");
  EXPECT_EQ(selected->action, QueueAction::kFetch);
  queue.insert(get("q3", "all_1_2_1"));  // the same part again, pulled later
  EXPECT_EQ(queue.forgetLostPart("q1", replica.parts()), std::vector<std::string>{"q3"});
  EXPECT_EQ(order(), std::vector<std::string>{"q2"});
  EXPECT_EQ(queue.executing(QueueAction::kFetch), 0u);
  EXPECT_EQ(queue.virtualParts().parts(),
            (std::vector<PartName>{queuedPart("all_1_1_0"), queuedPart("all_3_3_0")}));
  expectInvariant();
}

TEST_F(Queue, AFetchOfACoveringPartMakesTheEntriesItCoversWait) {
  queue = ReplicationQueue(QueueLimits{.fetch_pool_size = 4, .merge_pool_size = 1});
  queue.insert(get("q1", "all_1_1_0"));
  queue.insert(get("q2", "all_2_2_0"));
  queue.insert(get("q3", "all_3_3_0"));
  queue.insert(get("q4", "all_5_5_0"));
  auto first = select();
  auto second = select();
  ASSERT_TRUE(first && second);
  EXPECT_EQ(first->node_name, "q1");
  EXPECT_EQ(second->node_name, "q2");
  // q1 finds only all_1_3_1 (merged meanwhile): it fetches that; q2, inside it, gives way.
  EXPECT_TRUE(queue.setActualPart("q1", queuedPart("all_1_3_1")));
  EXPECT_FALSE(queue.setActualPart("q2", queuedPart("all_1_3_1")));
  EXPECT_FALSE(queue.setActualPart("q2", queuedPart("all_2_4_1")));  // overlaps q1's
  queue.giveWay("q2", "all_1_3_1 is fetched by q1", now);
  // q2 waits as postponed, not failed: no backoff, no try counted.
  const auto q2 = std::find_if(queue.entries().begin(), queue.entries().end(),
                               [](const QueueEntry& e) { return e.node_name == "q2"; });
  ASSERT_NE(q2, queue.entries().end());
  EXPECT_FALSE(q2->currently_executing);
  EXPECT_EQ(q2->num_tries, 0u);
  EXPECT_EQ(q2->last_exception, "");
  EXPECT_EQ(q2->postpone_reason, PostponeReason::kCoveredByFuturePart);
  // q3 is covered by the part q1 fetches: it waits; q4 is not.
  auto third = select();
  ASSERT_TRUE(third);
  EXPECT_EQ(third->node_name, "q4");
  EXPECT_EQ(queue.postponedCount(PostponeReason::kCoveredByFuturePart), 2u);  // q2's give-way, q3
  // Once q1 is done, the covered entries have nothing left to do, at once.
  replica.add("all_1_3_1");
  queue.addCurrentPart(queuedPart("all_1_3_1"));
  queue.finish("q1");
  EXPECT_TRUE(queue.futureParts().count(queuedPart("all_1_3_1")) == 0);
  std::set<std::string> no_ops;
  while (auto selected = select()) {
    EXPECT_EQ(selected->action, QueueAction::kNothing) << selected->node_name;
    no_ops.insert(selected->node_name);
  }
  EXPECT_EQ(no_ops, (std::set<std::string>{"q2", "q3"}));
}

TEST_F(Queue, AnEntryBackingOffNeedsNothingOnceItsPartIsHere) {
  queue.insert(get("q1", "all_1_1_0"));
  ASSERT_TRUE(select());
  queue.fail("q1", "no replica has the part", now);
  ASSERT_FALSE(select());  // backing off for 100 ms
  // A part covering it arrives another way (a fetch of the merged part).
  replica.add("all_1_2_1");
  queue.addCurrentPart(queuedPart("all_1_2_1"));
  auto selected = select();
  ASSERT_TRUE(selected);
  EXPECT_EQ(selected->action, QueueAction::kNothing);
}

// A table swap's attach entries are local work (hard links of parts the replica holds) that the
// replica runs in batches: a fetch pool busy with one real fetch holds none of them back.
TEST_F(Queue, AttachEntriesRunBesideAFullFetchPool) {
  queue.insert(get("q1", "all_1_1_0"));
  for (int i = 2; i <= 5; ++i) {
    QueueEntry attach =
        get("q" + std::to_string(i), "all_" + std::to_string(i) + "_" + std::to_string(i) + "_0");
    attach.entry.type = LogEntry::Type::kAttachPart;
    queue.insert(std::move(attach));
  }
  std::vector<std::pair<std::string, QueueAction>> taken;
  while (auto selected = select()) taken.emplace_back(selected->node_name, selected->action);
  EXPECT_EQ(taken,
            (std::vector<std::pair<std::string, QueueAction>>{{"q1", QueueAction::kFetch},
                                                              {"q2", QueueAction::kAttach},
                                                              {"q3", QueueAction::kAttach},
                                                              {"q4", QueueAction::kAttach},
                                                              {"q5", QueueAction::kAttach}}));
  EXPECT_EQ(queue.executing(QueueAction::kFetch), 1u);
  EXPECT_EQ(queue.executing(QueueAction::kAttach), 4u);
  EXPECT_EQ(queueActionName(QueueAction::kAttach), "attach");
}

TEST_F(Queue, SelectedEntryMovesToTheTail) {
  queue = ReplicationQueue(QueueLimits{.fetch_pool_size = 3, .merge_pool_size = 1});
  queue.insert(get("q1", "all_1_1_0"));
  queue.insert(get("q2", "all_2_2_0"));
  queue.insert(get("q3", "all_3_3_0"));
  auto first = select();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->node_name, "q1");
  EXPECT_EQ(order(), (std::vector<std::string>{"q2", "q3", "q1"}));
  EXPECT_TRUE(queue.entries().back().currently_executing);
  EXPECT_EQ(queue.entries().back().num_tries, 1u);
  EXPECT_EQ(queue.executing(QueueAction::kFetch), 1u);
}

TEST_F(Queue, PoolsLimitConcurrentFetchesAndMerges) {
  for (const auto* name : {"all_1_1_0", "all_2_2_0", "all_3_3_0", "all_4_4_0"}) {
    replica.add(name);
    queue.addCurrentPart(queuedPart(name));
  }
  queue.insert(get("q1", "all_5_5_0"));
  queue.insert(get("q2", "all_6_6_0"));
  queue.insert(merge("q3", {"all_1_1_0", "all_2_2_0"}, "all_1_2_1"));
  queue.insert(merge("q4", {"all_3_3_0", "all_4_4_0"}, "all_3_4_1"));
  expectInvariant();

  std::vector<std::string> taken;
  while (auto selected = select()) taken.push_back(selected->node_name);
  // One fetch and one merge at a time; the others wait for a slot.
  EXPECT_EQ(taken, (std::vector<std::string>{"q1", "q3"}));
  // q2 was passed over by both later selections, q4 by the last one.
  EXPECT_EQ(queue.postponedCount(PostponeReason::kFetchPoolFull), 2u);
  EXPECT_EQ(queue.postponedCount(PostponeReason::kMergePoolFull), 1u);
  EXPECT_EQ(queue.executing(QueueAction::kFetch), 1u);
  EXPECT_EQ(queue.executing(QueueAction::kMerge), 1u);

  complete({"q1", queue.entries()[2].entry, QueueAction::kFetch});
  auto next = select();
  ASSERT_TRUE(next);
  EXPECT_EQ(next->node_name, "q2");
  expectInvariant();
}

TEST_F(Queue, FailedEntriesBackOffExponentiallyUpToTheCap) {
  queue.insert(get("q1", "all_1_1_0"));
  ASSERT_TRUE(select());
  std::vector<int64_t> waits;
  for (int attempt = 0; attempt < 12; ++attempt) {
    queue.fail("q1", "no replica has the part", now);
    ASSERT_FALSE(select());
    EXPECT_EQ(queue.entries().front().postpone_reason, PostponeReason::kBackoffAfterFailure);
    // The earliest moment, in 50 ms steps, at which it is taken again.
    int64_t waited = 0;
    for (;;) {
      waited += 50;
      if (queue.selectEntryToProcess(replica.lookup(), false,
                                     now + std::chrono::milliseconds(waited)))
        break;
    }
    waits.push_back(waited);
    now += std::chrono::milliseconds(waited);
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 51200,
                                         60000, 60000}));
  EXPECT_EQ(queue.entries().front().num_tries, 13u);
  EXPECT_EQ(queue.entries().front().last_exception, "no replica has the part");
}

TEST_F(Queue, AMergeWhoseSourcesAreGoneForGoodFetchesTheResult) {
  // all_2_2_0 is neither here nor coming: the merged part is fetched instead.
  replica.add("all_1_1_0");
  queue.addCurrentPart(queuedPart("all_1_1_0"));
  queue.insert(merge("q1", {"all_1_1_0", "all_2_2_0"}, "all_1_2_1"));
  auto selected = select();
  ASSERT_TRUE(selected);
  EXPECT_EQ(selected->action, QueueAction::kFetch);
  complete(*selected);
  EXPECT_EQ(replica.parts(), std::vector<PartName>{queuedPart("all_1_2_1")});
  expectInvariant();
}

TEST_F(Queue, APartAlreadyHereOrCoveredNeedsNothing) {
  replica.add("all_1_3_2");
  queue.addCurrentPart(queuedPart("all_1_3_2"));
  queue.insert(get("q1", "all_2_2_0"));                                // covered by all_1_3_2
  queue.insert(merge("q2", {"all_1_1_0", "all_2_2_0"}, "all_1_2_1"));  // covered too
  queue.insert(get("q3", "all_1_3_2"));                                // here
  expectInvariant();
  std::vector<QueueAction> actions;
  while (auto selected = select()) {
    actions.push_back(selected->action);
    complete(*selected);
  }
  EXPECT_EQ(actions, std::vector<QueueAction>(3, QueueAction::kNothing));
  EXPECT_TRUE(queue.empty());
  expectInvariant();
}

TEST_F(Queue, ReadonlyReplicaPostponesEverything) {
  queue.insert(get("q1", "all_1_1_0"));
  queue.insert(get("q2", "all_2_2_0"));
  EXPECT_FALSE(queue.selectEntryToProcess(replica.lookup(), true, now));
  EXPECT_EQ(queue.postponedCount(PostponeReason::kReplicaReadonly), 2u);
  EXPECT_TRUE(select());
}

TEST_F(Queue, DropRangeHoldsBackEntriesItCoversAndRemovesThemWhenDone) {
  replica.add("202611_1_1_0");
  queue.addCurrentPart(queuedPart("202611_1_1_0"));
  queue.insert(get("q1", "202611_2_2_0"));
  queue.insert(dropRange("q2", "202611_0_2_999999999"));
  queue.insert(get("q3", "202612_3_3_0"));  // another partition: not affected
  expectInvariant();
  EXPECT_EQ(queue.virtualParts().parts(), (std::vector<PartName>{queuedPart("202611_0_2_999999999"),
                                                                 queuedPart("202612_3_3_0")}));

  auto first = select();
  ASSERT_TRUE(first);
  EXPECT_EQ(first->node_name, "q2");
  EXPECT_EQ(first->action, QueueAction::kDropRange);
  EXPECT_EQ(queue.postponedCount(PostponeReason::kIntersectsDropRange), 1u);
  // The replica drops its parts in the range, then finishes the entry.
  replica.active.remove(queuedPart("202611_1_1_0"));
  const auto removed = queue.finish("q2");
  EXPECT_EQ(removed, std::vector<std::string>{"q1"});
  EXPECT_EQ(order(), std::vector<std::string>{"q3"});
  expectInvariant();
}

TEST_F(Queue, TheInvariantCheckSeesADifference) {
  replica.add("all_1_1_0");
  queue.insert(get("q1", "all_2_2_0"));
  // all_1_1_0 became active without the queue being told.
  const std::string broken = queue.checkVirtualPartsInvariant(replica.parts());
  EXPECT_NE(broken.find("virtual parts [all_2_2_0] != current parts + queue [all_1_1_0 all_2_2_0]"),
            std::string::npos)
      << broken;
}

TEST(PostponeReasons, HaveTheMetricLabelNames) {
  std::set<std::string_view> names;
  for (auto reason : kAllPostponeReasons) names.insert(postponeReasonName(reason));
  EXPECT_EQ(names, (std::set<std::string_view>{"covered_by_future_part", "merge_source_missing",
                                               "intersects_drop_range", "fetch_pool_full",
                                               "merge_pool_full", "backoff_after_failure",
                                               "replica_readonly"}));
}

}  // namespace
}  // namespace rtable::core
