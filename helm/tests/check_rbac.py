#!/usr/bin/env python3
"""Compares the chart's RBAC rules with the Kubernetes calls of operator/src and controllers/src.

usage: check_rbac.py <repo> <rendered chart yaml>

The operator's rules are the ClusterRole's, or with watchNamespace the Role's in that namespace.

USED lists each (group, resource) the operator calls, with the verbs and where. The check fails
when the rendered ClusterRole + Role grant less than USED (the operator would get 403s) or more
than USED + RESERVED (not least privilege), or when the code names a resource type that USED does
not know (a new call: add it here, to templates/rbac.yaml and to docs/helm.md).
"""
import glob
import os
import re
import sys

import yaml

# (group, resource) -> (verbs, why). Informers list + watch; server-side apply is a PATCH that
# creates a missing object, so the apiserver asks for create as well as patch.
USED = {
    ("rtable.io", "replicatedtables"): ({"get", "list", "watch", "patch"},
        "informer; reconcile reads the table; finalizer add/remove (JSON patch)"),
    ("rtable.io", "replicatedtables/status"): ({"patch"}, "status merge patch"),
    ("rtable.io", "replicatedtables/finalizers"): ({"update"},
        "owned objects carry blockOwnerDeletion owner references"),
    ("apps", "statefulsets"): ({"list", "watch", "create", "patch", "delete"},
        "informer (managed-by label); server-side apply; deleted before the ZooKeeper tree"),
    ("", "configmaps"): ({"list", "watch", "create", "patch"},
        "informer (managed-by label: cached reads, unchanged applies not sent); server-side apply "
        "of <table>-config"),
    ("", "services"): ({"list", "watch", "create", "patch"},
        "informer (managed-by label); server-side apply of the two Services"),
    ("", "secrets"): ({"get", "create", "patch", "delete"},
        "interserver Secret read, then applied; the table's ZooKeeper identity read, created, "
        "and deleted with the ZooKeeper tree; an S3 backup's credentials Secret read"),
    ("policy", "poddisruptionbudgets"): ({"list", "watch", "create", "patch"},
        "informer (managed-by label); server-side apply"),
    ("networking.k8s.io", "networkpolicies"): ({"list", "watch", "create", "patch", "delete"},
        "informer (managed-by label); a table's NetworkPolicy: server-side apply; deleted when "
        "spec.networkPolicy is off"),
    ("", "pods"): ({"get", "list"}, "scale-down and deletion wait for pods"),
    ("", "persistentvolumeclaims"): ({"get"},
        "a backup's or restore's claim read (ClaimNotFound, ClaimNotShared)"),
    ("", "events"): ({"create", "patch"}, "EventRecorder: create, repeats patch count"),
    ("coordination.k8s.io", "leases"): ({"get", "create", "update"}, "leader election"),
    ("rtable.io", "backupschedules"): ({"get", "list", "watch"},
        "informer; reconcile reads the schedule"),
    ("rtable.io", "backupschedules/status"): ({"patch"}, "status merge patch"),
    ("rtable.io", "backupschedules/finalizers"): ({"update"},
        "scheduled ClusterBackups carry blockOwnerDeletion owner references"),
    ("rtable.io", "clusterbackups"): ({"get", "list", "watch", "create", "patch", "delete"},
        "ClusterBackup controller: informer, reconcile reads the backup, finalizer add/remove "
        "(JSON patch); BackupSchedule "
        "controller: informer (owner enqueue), scheduled runs created, read on AlreadyExists, "
        "Replace and retention delete"),
    ("rtable.io", "clusterbackups/status"): ({"patch"}, "the ClusterBackup controller's status"),
}
# Granted ahead of the code: nothing now.
RESERVED = {}
# Functions of controllers/ that name a custom resource type -> (group, resource).
CUSTOM_RESOURCE_FUNCTIONS = {
    "replicatedTables": ("rtable.io", "replicatedtables"),
    "backupSchedules": ("rtable.io", "backupschedules"),
    "clusterBackups": ("rtable.io", "clusterbackups"),
}
# op::resources::<fn>() -> (group, resource). Those the operator may name without needing a
# grant: namespaces is only the apiserver probe, where a 403 counts as an answer.
RESOURCE_FUNCTIONS = {
    "pods": ("", "pods"), "services": ("", "services"), "configMaps": ("", "configmaps"),
    "secrets": ("", "secrets"), "events": ("", "events"),
    "statefulSets": ("apps", "statefulsets"),
    "podDisruptionBudgets": ("policy", "poddisruptionbudgets"),
    "networkPolicies": ("networking.k8s.io", "networkpolicies"),
    "leases": ("coordination.k8s.io", "leases"),
    "persistentVolumeClaims": ("", "persistentvolumeclaims"),
}
NOT_NEEDED = {"namespaces"}
# Only the leader-election Role may grant leases, and only it.
ROLE_ONLY = {("coordination.k8s.io", "leases")}


def grants(rules):
    out = {}
    for rule in rules or []:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                out.setdefault((group, resource), set()).update(rule.get("verbs", []))
    return out


def main():
    repo, rendered = sys.argv[1], sys.argv[2]
    failures = []
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    leases = [d for d in docs
              if d["kind"] == "Role" and d["metadata"]["name"].endswith("-leader-election")]
    # The operator's rules: a ClusterRole, or with watchNamespace a Role in that namespace.
    operator_rules = [d for d in docs if d["kind"] == "ClusterRole"] or [
        d for d in docs
        if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-leader-election")]
    cluster = grants(operator_rules[0]["rules"])
    role = grants(leases[0]["rules"]) if leases else {}

    # What the code names.
    sources = [p for d in ("operator/src", "controllers/src")
               for p in glob.glob(os.path.join(repo, d, "*.cpp"))]
    named = set()
    for path in sources:
        text = open(path).read()
        named.update(re.findall(r"resources::(\w+)\(\)", text))
        for fn in CUSTOM_RESOURCE_FUNCTIONS:
            if re.search(r"\b" + fn + r"\(\)", text):
                named.add(fn)
    for fn in sorted(named - NOT_NEEDED - set(CUSTOM_RESOURCE_FUNCTIONS)):
        if fn not in RESOURCE_FUNCTIONS:
            failures.append(f"the code calls resources::{fn}() but check_rbac.py does not know it")
        elif RESOURCE_FUNCTIONS[fn] not in USED:
            failures.append(f"the code calls resources::{fn}() but USED has no rule for it")
    known = {RESOURCE_FUNCTIONS[f] for f in named if f in RESOURCE_FUNCTIONS}
    known.update(CUSTOM_RESOURCE_FUNCTIONS[f] for f in named if f in CUSTOM_RESOURCE_FUNCTIONS)
    for key in USED:
        base = (key[0], key[1].split("/")[0])
        if base not in known:
            failures.append(f"USED lists {key} but the code never names it: drop the grant")

    for key, (verbs, why) in USED.items():
        where = role if key in ROLE_ONLY else cluster
        missing = verbs - where.get(key, set())
        if missing:
            failures.append(f"{key}: {sorted(missing)} not granted ({why})")
    for name, granted, allowed in (
        ("ClusterRole", cluster,
         {k: v for k, (v, _) in USED.items() if k not in ROLE_ONLY} | RESERVED),
        ("Role", role, {k: USED[k][0] for k in ROLE_ONLY}),
    ):
        for key, verbs in granted.items():
            extra = verbs - allowed.get(key, set())
            if extra:
                failures.append(f"{name} grants {key} {sorted(extra)}, which the operator does not use")
    for failure in failures:
        print(f"check_rbac: FAIL {failure}")
    if not failures:
        print(f"check_rbac: ok, {len(USED)} used + {len(RESERVED)} reserved resource rules match "
              f"the code ({', '.join(sorted(named))})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
