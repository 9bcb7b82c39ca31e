package io.rtable.tools;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.File;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.jute.BinaryInputArchive;
import org.apache.jute.BinaryOutputArchive;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.common.PathUtils;
import org.apache.zookeeper.server.DataNode;
import org.apache.zookeeper.server.DataTree;
import org.apache.zookeeper.server.persistence.FileTxnSnapLog;
import org.apache.zookeeper.txn.ErrorTxn;
import org.apache.zookeeper.txn.TxnHeader;

/**
 * Offline tool: sets the sequential-child counter of one znode in a STOPPED ZooKeeper
 * (>= 3.6) server's data directory by writing a new snapshot at the last logged zxid.
 *
 * Usage: SetSequentialCounter dataDir znodePath counter [dataLogDir]
 * (dataDir / dataLogDir as in zoo.cfg, without the version-2 suffix; dataLogDir defaults to dataDir).
 */
public final class SetSequentialCounter {

    public static void main(String[] args) {
        try {
            System.out.println(run(args));
        } catch (Exception e) {
            System.err.println("error: " + e.getMessage());
            System.exit(1);
        }
    }

    static String run(String[] args) throws Exception {
        if (args.length < 3 || args.length > 4) {
            throw new IllegalArgumentException(
                "usage: SetSequentialCounter <dataDir> <znode path> <counter 0..2147483647> [dataLogDir]"
                    + " (ZooKeeper server must be stopped)");
        }
        File dataDir = new File(args[0]);
        File logDir = new File(args.length == 4 ? args[3] : args[0]);
        String path = args[1];
        PathUtils.validatePath(path);
        int counter;
        try {
            counter = Integer.parseInt(args[2]);
        } catch (NumberFormatException e) {
            counter = -1;
        }
        if (counter < 0) {
            throw new IllegalArgumentException("counter must be an integer in [0, 2147483647]: " + args[2]);
        }
        // FileTxnSnapLog appends version-2 itself and would otherwise create missing directories.
        for (File dir : new File[] {dataDir, logDir}) {
            if (!new File(dir, FileTxnSnapLog.version + FileTxnSnapLog.VERSION).isDirectory()) {
                throw new IllegalArgumentException(
                    "no version-2 directory in " + dir + " (pass zoo.cfg's dataDir, not its version-2 subfolder)");
            }
        }

        FileTxnSnapLog snapLog = new FileTxnSnapLog(logDir, dataDir);
        try {
            // Without a snapshot, restore() would write an empty snapshot.0 itself.
            if (snapLog.findMostRecentSnapshot() == null) {
                throw new IllegalStateException("no valid snapshot in " + snapLog.getSnapDir());
            }
            DataTree tree = new DataTree();
            ConcurrentHashMap<Long, Integer> sessions = new ConcurrentHashMap<>();
            snapLog.restore(tree, sessions, (hdr, txn, digest) -> { });
            // Saving at the highest replayed zxid means the server replays nothing after our snapshot.
            long zxid = tree.lastProcessedZxid;
            // A server that has committed anything keeps the log holding its latest snapshot's zxid;
            // none here most likely means the logs live in a separate dataLogDir we would silently ignore.
            if (zxid > 0 && snapLog.getLastLoggedZxid() == -1) {
                throw new IllegalStateException("no transaction logs in " + snapLog.getDataDir()
                    + " (if zoo.cfg sets dataLogDir, pass it as 4th argument)");
            }

            DataNode node = tree.getNode(path);
            if (node == null) {
                throw new IllegalArgumentException("node not found: " + path);
            }
            int old = node.stat.getCversion();
            // In ZooKeeper >= 3.6 the persisted cversion is the counter used for the next sequential name.
            // Edited directly because setCversionPzxid() can only raise it; this leaves the tree digest stale.
            node.stat.setCversion(counter);

            DataTree rebuilt = rebuild(tree);
            rebuilt.lastProcessedZxid = zxid;
            // A no-op txn at the same zxid records (zxid, tree digest) as the digest saved in the snapshot,
            // which the server checks when it loads it; without it the snapshot would carry none or a stale one.
            rebuilt.processTxn(new TxnHeader(0, 0, zxid, 0, ZooDefs.OpCode.error), new ErrorTxn(0));
            snapLog.save(rebuilt, sessions, true);
            return String.format("set counter of %s to %d (was %d) in snapshot.%x", path, counter, old, zxid);
        } finally {
            snapLog.close();
        }
    }

    /** Copies the tree through its snapshot serialization, so that its digest is computed from scratch. */
    private static DataTree rebuild(DataTree tree) throws Exception {
        ByteArrayOutputStream buf = new ByteArrayOutputStream();
        tree.serialize(BinaryOutputArchive.getArchive(buf), "tree");
        DataTree copy = new DataTree();
        copy.deserialize(BinaryInputArchive.getArchive(new ByteArrayInputStream(buf.toByteArray())), "tree");
        return copy;
    }
}
