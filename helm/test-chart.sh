#!/usr/bin/env bash
# Tests of the Helm chart (helm/rtable), its alert rules and the Dockerfile; no cluster and no
# container engine needed. Exits non-zero when a check fails, after running all of them, and
# names each failure.
#   helm/test-chart.sh                     (ctest: helm_chart_tests)
#   RTABLE_BIN_DIR=build/bin helm/test-chart.sh    also check the binaries' libraries (ldd)
# Needs helm (e2e/build-control-plane.sh builds it), promtool (Debian's prometheus) and
# python3-yaml: scripts/install-deps.sh --test installs the last two.
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
chart="$repo/helm/rtable"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
failures=()
pass() { echo "ok   $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); failures+=("$1"); }
# check <name> <command...>: passes when the command exits 0; its output is shown on failure.
check() {
  local name=$1
  shift
  if "$@" >"$work/out" 2>&1; then pass "$name"; else fail "$name"; sed 's/^/     /' "$work/out"; fi
}
# rejects <name> <pattern> <helm template args...>: helm template must fail, saying <pattern>.
rejects() {
  local name=$1 pattern=$2
  shift 2
  if "$helm" template t "$chart" "$@" >"$work/out" 2>&1; then
    fail "$name (accepted)"
  elif ! grep -qiE -- "$pattern" "$work/out"; then
    fail "$name (refused, but not for '$pattern')"
    sed 's/^/     /' "$work/out"
  else
    pass "$name"
  fi
}

helm="$("$repo/e2e/build-control-plane.sh" | tail -n 1)/helm"
for tool in "$helm" promtool python3; do
  if ! command -v "$tool" >/dev/null; then
    echo "test-chart: $tool is missing (scripts/install-deps.sh --test, e2e/build-control-plane.sh)" >&2
    exit 1
  fi
done
if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "test-chart: python3-yaml is missing (scripts/install-deps.sh --test)" >&2
  exit 1
fi

# --- lint
check "helm lint" "$helm" lint "$chart"
check "helm lint --strict" "$helm" lint --strict "$chart"
check "helm lint --strict, monitoring on, 2 replicas" "$helm" lint --strict "$chart" \
  --set serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true,replicaCount=2

# --- the CRDs are crds/ byte for byte, all three and only them
crds_match() {
  local ok=0
  diff <(cd "$repo/crds" && ls -- *.yaml) <(cd "$chart/crds" && ls -- *.yaml) || ok=1
  for f in "$repo"/crds/*.yaml; do
    cmp "$f" "$chart/crds/$(basename "$f")" || ok=1
  done
  [[ $(ls "$chart"/crds/*.yaml | wc -l) -eq 3 ]] || { echo "expected 3 CRDs"; ok=1; }
  return $ok
}
check "chart crds/ = crds/*.yaml (cp crds/*.yaml helm/rtable/crds/)" crds_match

# --- rendering
# kinds <file> <kind...>: the rendered documents are exactly these kinds, each once.
kinds() {
  local file=$1
  shift
  python3 - "$file" "$@" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
got = sorted(d["kind"] for d in docs)
want = sorted(sys.argv[2:])
if got != want:
    sys.exit(f"rendered kinds {got}, expected {want}")
PY
}
render() { "$helm" template r "$chart" --namespace rtable-system --include-crds "$@"; }
# helm template leaves NOTES.txt out and helm install --dry-run wants a cluster: a copy of the
# chart renders it through tpl into a ConfigMap.
notes_render() {
  rm -rf "$work/notes" && cp -r "$chart" "$work/notes"
  cp "$chart/templates/NOTES.txt" "$work/notes/notes.txt"
  printf '%s\n' 'apiVersion: v1' 'kind: ConfigMap' 'metadata: {name: notes}' \
    'data: {notes: {{ tpl (.Files.Get "notes.txt") . | quote }}}' >"$work/notes/templates/notes.yaml"
  "$helm" template r "$work/notes" --namespace rtable-system --set zookeeper.connect=zk-0.zk:2181 \
    --show-only templates/notes.yaml | python3 -c '
import sys, yaml
notes = yaml.safe_load(sys.stdin)["data"]["notes"]
print(notes)
assert "connect: zk-0.zk:2181" in notes and "rtable-system" in notes, "connect string or namespace missing"
'
}

if render >"$work/default.yaml" 2>"$work/out"; then
  pass "helm template (defaults)"
  check "defaults render the CRDs, Deployment, SA, RBAC, Service; no monitoring" \
    kinds "$work/default.yaml" CustomResourceDefinition CustomResourceDefinition \
    CustomResourceDefinition ServiceAccount ClusterRole ClusterRoleBinding Role RoleBinding \
    Service Deployment
  check "default Deployment: flags, env, probes, security" python3 - "$work/default.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
dep = next(d for d in docs if d["kind"] == "Deployment")
pod = dep["spec"]["template"]["spec"]
c = pod["containers"][0]
errors = []
def want(cond, what):
    if not cond: errors.append(what)
want(dep["spec"]["replicas"] == 1, "replicas 1")
want(c["command"] == ["rtable-operator"], "command rtable-operator")
for flag in ["--leader-elect=true", "--leader-election-namespace=$(POD_NAMESPACE)",
             "--health-probe-bind-address=:8081", "--metrics-bind-address=:8080",
             "--log-level=info", "--graceful-shutdown-timeout=30s"]:
    want(flag in c["args"], f"arg {flag}")
env = {e["name"]: e for e in c["env"]}
want(env.get("RTABLE_CORE_IMAGE", {}).get("value") == "rtable/rtable:0.1.0", "RTABLE_CORE_IMAGE")
want("WATCH_NAMESPACE" not in env, "no WATCH_NAMESPACE by default")
want(env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace", "POD_NAMESPACE")
want(c["image"] == "rtable/rtable-operator:0.1.0", "image")
want(c["livenessProbe"]["httpGet"]["path"] == "/healthz", "liveness /healthz")
want(c["readinessProbe"]["httpGet"]["path"] == "/readyz", "readiness /readyz")
ports = {p["name"]: p["containerPort"] for p in c["ports"]}
want(ports == {"probes": 8081, "metrics": 8080}, f"ports {ports}")
want(pod["securityContext"]["runAsNonRoot"] is True, "runAsNonRoot")
want(c["securityContext"]["readOnlyRootFilesystem"] is True, "readOnlyRootFilesystem")
want(c["securityContext"]["allowPrivilegeEscalation"] is False, "no privilege escalation")
want(pod["terminationGracePeriodSeconds"] > 30, "grace period beyond the shutdown timeout")
for d in docs:
    if d["kind"] == "CustomResourceDefinition":
        continue
    labels = d["metadata"]["labels"]
    for key in ["app.kubernetes.io/name", "app.kubernetes.io/instance",
                "app.kubernetes.io/version", "app.kubernetes.io/managed-by", "helm.sh/chart"]:
        want(key in labels, f"{d['kind']} label {key}")
svc = next(d for d in docs if d["kind"] == "Service")
tmpl_labels = dep["spec"]["template"]["metadata"]["labels"]
want(all(tmpl_labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "Service selects the pods")
want(next(d for d in docs if d["kind"] == "Role")["metadata"]["namespace"] == "rtable-system",
     "Lease Role in the release namespace")
if errors:
    sys.exit("missing: " + "; ".join(errors))
PY
else
  fail "helm template (defaults)"
  sed 's/^/     /' "$work/out"
fi

if render --set serviceMonitor.enabled=true,podMonitor.enabled=true,prometheusRule.enabled=true \
  --set replicaCount=2 \
  --set watchNamespace=tables,logLevel=debug,zookeeper.connect=zk-0.zk:2181 \
  >"$work/monitoring.yaml" 2>"$work/out"; then
  pass "helm template (monitoring on, 2 replicas, watchNamespace, logLevel debug)"
  check "monitoring adds a ServiceMonitor, a PodMonitor and a PrometheusRule" \
    kinds "$work/monitoring.yaml" CustomResourceDefinition CustomResourceDefinition \
    CustomResourceDefinition ServiceAccount Role Role RoleBinding RoleBinding \
    Service Deployment ServiceMonitor PodMonitor PrometheusRule
  check "values reach the Deployment (replicas 2, WATCH_NAMESPACE, --log-level=debug)" \
    python3 - "$work/monitoring.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
dep = next(d for d in docs if d["kind"] == "Deployment")
c = dep["spec"]["template"]["spec"]["containers"][0]
env = {e["name"]: e.get("value") for e in c["env"]}
assert dep["spec"]["replicas"] == 2, dep["spec"]["replicas"]
assert env.get("WATCH_NAMESPACE") == "tables", env
assert "--log-level=debug" in c["args"], c["args"]
sm = next(d for d in docs if d["kind"] == "ServiceMonitor")
assert sm["spec"]["endpoints"][0]["port"] == "metrics", sm
PY
  # The PodMonitor's selector against real replica pods: operator_swap_e2e_tests scrapes the pods
  # it selects.
  check "PodMonitor: replica pods' port metrics, in watchNamespace" \
    python3 - "$work/monitoring.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
pm = next(d for d in docs if d["kind"] == "PodMonitor")["spec"]
assert pm["selector"]["matchLabels"]["app.kubernetes.io/component"] == "replica", pm["selector"]
ep = pm["podMetricsEndpoints"][0]
assert ep["port"] == "metrics" and ep["path"] == "/metrics", ep
assert pm["namespaceSelector"] == {"matchNames": ["tables"]}, pm["namespaceSelector"]
PY
  check "PodMonitor without watchNamespace: every namespace" bash -c \
    "'$helm' template r '$chart' --set podMonitor.enabled=true --show-only templates/podmonitor.yaml \
     | python3 -c 'import sys, yaml; pm = yaml.safe_load(sys.stdin); assert pm[\"spec\"][\"namespaceSelector\"] == {\"any\": True}, pm'"
  check "prometheusRule.headroomFor sets the headroom alert's for" bash -c \
    "'$helm' template r '$chart' --set prometheusRule.enabled=true,prometheusRule.headroomFor=3s \
     --show-only templates/prometheusrule.yaml | python3 -c '
import sys, yaml
rules = {r.get(\"alert\"): r for g in yaml.safe_load(sys.stdin)[\"spec\"][\"groups\"] for r in g[\"rules\"]}
assert rules[\"RtableLogCounterHeadroomLow\"][\"for\"] == \"3s\", rules[\"RtableLogCounterHeadroomLow\"]
'"
  check "networkPolicy: the operator admits /metrics from metricsFrom and the probes only" bash -c \
    "'$helm' template r '$chart' --set networkPolicy.enabled=true \
     --set 'networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring' \
     --show-only templates/networkpolicy.yaml | python3 -c '
import sys, yaml
np = yaml.safe_load(sys.stdin)
assert np[\"kind\"] == \"NetworkPolicy\" and np[\"spec\"][\"policyTypes\"] == [\"Ingress\"], np
assert np[\"spec\"][\"podSelector\"][\"matchLabels\"][\"app.kubernetes.io/name\"] == \"rtable\", np
metrics, probes = np[\"spec\"][\"ingress\"]
assert metrics[\"ports\"] == [{\"port\": \"metrics\", \"protocol\": \"TCP\"}], metrics
assert metrics[\"from\"] == [{\"namespaceSelector\": {\"matchLabels\": {\"team\": \"monitoring\"}}}], metrics
assert probes == {\"ports\": [{\"port\": \"probes\", \"protocol\": \"TCP\"}]}, probes
'"
  check "networkPolicy off by default" bash -c \
    "! '$helm' template r '$chart' | grep -q 'kind: NetworkPolicy'"
  check "NOTES.txt renders with the ZooKeeper connect string" notes_render
  # The alert rules: promtool's syntax check, then its unit tests (helm/rtable/tests).
  mkdir -p "$work/rules"
  if python3 - "$work/monitoring.yaml" "$work/rules/rules.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
rule = next(d for d in docs if d["kind"] == "PrometheusRule")
yaml.safe_dump(rule["spec"], open(sys.argv[2], "w"), sort_keys=False)
PY
  then
    check "promtool check rules" promtool check rules "$work/rules/rules.yaml"
    cp "$chart/tests/alerts_test.yaml" "$work/rules/"
    check "promtool test rules (helm/rtable/tests/alerts_test.yaml)" \
      bash -c "cd '$work/rules' && promtool test rules alerts_test.yaml"
    check "every alert has a promtool test and a section in docs/helm.md" python3 - \
      "$work/rules/rules.yaml" "$chart/tests/alerts_test.yaml" "$repo/docs/helm.md" <<'PY'
import sys, yaml
rules = yaml.safe_load(open(sys.argv[1]))
alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
tests = yaml.safe_load(open(sys.argv[2]))
tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])}
fired = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])
         if t.get("exp_alerts")}
docs = open(sys.argv[3]).read()
problems = [f"{a}: no test that it fires" for a in alerts - fired]
problems += [f"{a}: not in docs/helm.md" for a in alerts if f"`{a}`" not in docs]
problems += [f"{a}: tested but no such alert" for a in tested - alerts]
if problems:
    sys.exit("; ".join(problems))
PY
  else
    fail "extract the PrometheusRule's spec"
  fi
  check "RBAC covers the operator's calls and no more (helm/tests/check_rbac.py)" \
    python3 "$repo/helm/tests/check_rbac.py" "$repo" "$work/monitoring.yaml"
else
  fail "helm template (monitoring on, 2 replicas)"
  sed 's/^/     /' "$work/out"
fi

if "$helm" template r "$chart" --namespace rtable-system --set watchNamespace=analytics \
    >"$work/namespaced.yaml" 2>"$work/out"; then
  check "watchNamespace: no cluster-wide grant, the operator's Role and RoleBinding in it" bash -c \
    "! grep -qE '^kind: Cluster(Role|RoleBinding)' '$work/namespaced.yaml' && \
     python3 - '$work/namespaced.yaml' <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
mine = [d for d in docs if d['kind'] in ('Role', 'RoleBinding')
        and not d['metadata']['name'].endswith('-leader-election')]
assert sorted(d['kind'] for d in mine) == ['Role', 'RoleBinding'], mine
assert all(d['metadata']['namespace'] == 'analytics' for d in mine), mine
binding = next(d for d in mine if d['kind'] == 'RoleBinding')
assert binding['subjects'][0]['namespace'] == 'rtable-system', binding
PY"
  check "watchNamespace: the Role covers the operator's calls and no more" \
    python3 "$repo/helm/tests/check_rbac.py" "$repo" "$work/namespaced.yaml"
else
  fail "helm template --set watchNamespace=analytics"
  sed 's/^/     /' "$work/out"
fi
check "rbac.create=false renders no RBAC" bash -c \
  "out=\$('$helm' template r '$chart' --set rbac.create=false) && ! grep -qE '^kind: (Cluster)?Role' <<<\"\$out\""
check "leaderElection.enabled=false: no Lease Role, --leader-elect=false" bash -c \
  "out=\$('$helm' template r '$chart' --set leaderElection.enabled=false) && \
   ! grep -q '^kind: Role\$' <<<\"\$out\" && grep -q -- '--leader-elect=false' <<<\"\$out\""

# --- the schema refuses bad values
rejects "schema refuses replicaCount: 0" "replicaCount" --set replicaCount=0
rejects "schema refuses logLevel: loud" "logLevel" --set logLevel=loud
rejects "schema refuses image.pullPolicy: Sometimes" "pullPolicy" --set image.pullPolicy=Sometimes
rejects "schema refuses a string replicaCount" "replicaCount" --set-string replicaCount=two
rejects "schema refuses an unknown value" "additional properties|replicas" --set replicas=3
rejects "schema refuses a bad lease duration" "leaseDuration" --set leaderElection.leaseDuration=soon
rejects "schema refuses a bad zookeeper.connect" "connect" --set zookeeper.connect=zk-without-port
rejects "schema refuses a bad prometheusRule.headroomFor" "headroomFor" --set prometheusRule.headroomFor=soon
rejects "replicaCount 2 without leader election is refused" "leaderElection" \
  --set replicaCount=2,leaderElection.enabled=false

# --- the Dockerfile's packages (and, given the binaries, their libraries)
check "Dockerfile packages exist in Debian 12 and cover the binaries' libraries" \
  python3 "$repo/helm/tests/check_image_packages.py" "$repo" "${RTABLE_BIN_DIR:-}"
sed -n '1p' "$work/out" 2>/dev/null | grep -q SKIP && sed 's/^/     /' "$work/out"

echo
for f in "${failures[@]}"; do echo "failed: $f"; done
echo "$passed passed, $failed failed"
((failed == 0))
