#!/usr/bin/env bash
# examples/kubernetes/ without a cluster: every manifest passes Kubernetes' API
# schemas (kubernetes-validate --strict: the schemas ship inside the package,
# nothing is fetched; an unknown or misspelt field fails too), and the pieces
# that no schema sees fit together (the Job's pods name the headless Service
# and are selected by it, one pod per node, completions = parallelism = the
# driver's nnodes, the agents dial pod 0's name on the driver's port, the
# token file is readable by its owner only, the pods' script parses). Broken
# copies of the manifests must fail both checks, so that this test can fail.
# Usage: kubernetes_manifests.sh SOURCE_DIR PYTHON    (PYTHON: the venv's, scripts/setup_python.sh)
set -euo pipefail
src=$1 python=$2
dir="$src/examples/kubernetes"
if ! "$python" -c 'import kubernetes_validate' 2>/dev/null; then
  echo "skipped: no kubernetes-validate in $python's environment (scripts/setup_python.sh installs it)"
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

schemas() { "$python" -m kubernetes_validate --strict --quiet "$@"; }

# What the schemas cannot see; one line per problem, exit 1 when there is one.
fit() {
  "$python" - "$1" <<'EOF'
import glob, os, re, subprocess, sys, yaml
docs = [d for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.yaml")))
        for d in yaml.safe_load_all(open(f)) if d]
kinds = {d["kind"]: d for d in docs}
problems = []
def check(ok, what):
    if not ok:
        problems.append(what)
svc, job = kinds.get("Service"), kinds.get("Job")
check(svc is not None and job is not None, "a Service and a Job")
if svc and job:
    pod = job["spec"]["template"]
    spec = pod["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    labels = pod["metadata"].get("labels", {})
    check(svc["spec"].get("clusterIP") == "None", "the Service is headless (clusterIP: None)")
    check(spec.get("subdomain") == svc["metadata"]["name"], "the pods' subdomain is the Service")
    check(svc["spec"]["selector"].items() <= labels.items(), "the Service selects the Job's pods")
    js = job["spec"]
    check(js.get("completionMode") == "Indexed", "an Indexed Job (pod index = node rank)")
    check(js.get("completions") == js.get("parallelism") == int(env.get("NNODES", -1)),
          "completions = parallelism = NNODES")
    terms = spec.get("affinity", {}).get("podAntiAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution", [])
    check(any(t.get("topologyKey") == "kubernetes.io/hostname" and
              t["labelSelector"]["matchLabels"].items() <= labels.items() for t in terms),
          "one pod per node (a required anti-affinity on kubernetes.io/hostname)")
    port = int(env.get("BATON_PORT", -1))
    check(port in [p["port"] for p in svc["spec"]["ports"]], "the Service has the driver's port")
    check(port in [p["containerPort"] for p in c.get("ports", [])], "the container has the port")
    script = "\n".join(c.get("args", []))
    driver = "%s-0.%s:$BATON_PORT" % (job["metadata"]["name"], svc["metadata"]["name"])
    check('driver="%s"' % driver in script, "the agents dial pod 0 as " + driver)
    check("--node-rank \"$JOB_COMPLETION_INDEX\"" in script, "node rank = the pod's index")
    check("trainer.cluster_listen=" in script and "trainer.nnodes=\"$NNODES\"" in script,
          "the driver listens for NNODES agents")
    check(subprocess.run(["bash", "-n"], input=script.encode()).returncode == 0,
          "the pods' script parses (bash -n)")
    token = env.get("BATON_CLUSTER_TOKEN_FILE", "")
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    secrets = [v for v in spec.get("volumes", []) if "secret" in v]
    check(any(os.path.join(mounts.get(v["name"], "?"), i["path"]) == token
              and v["secret"].get("defaultMode", 0o644) & 0o077 == 0
              for v in secrets for i in v["secret"].get("items", [])),
          "BATON_CLUSTER_TOKEN_FILE is a Secret's file, mode 0400 or 0600")
for p in problems:
    print("examples/kubernetes: wrong: " + p)
sys.exit(1 if problems else 0)
EOF
}

# Writes a copy of examples/kubernetes/ to $tmp/$1 with sed expression $2
# applied to $3; fails when the expression changed nothing.
broken() {
  mkdir -p "$tmp/$1"
  cp "$dir"/*.yaml "$tmp/$1/"
  sed -i "$2" "$tmp/$1/$3"
  ! cmp -s "$dir/$3" "$tmp/$1/$3" || { echo "$1: '$2' changed nothing in $3"; exit 1; }
}

schemas "$dir"/*.yaml
echo "$(ls "$dir"/*.yaml | wc -l) manifests pass Kubernetes' schemas:" \
  "$(cd "$dir" && echo *.yaml)"
fit "$dir"
echo "and fit together"

broken type 's/^  completions: 2$/  completions: two/' grpo-job.yaml
broken misspelt 's/restartPolicy:/restartPolcy:/' grpo-job.yaml
for b in type misspelt; do
  if schemas "$tmp/$b/grpo-job.yaml" >"$tmp/$b.out" 2>&1; then
    echo "FAILED: a broken Job ($b) passed the schemas"
    exit 1
  fi
  echo "a broken Job ($b) is refused: $(grep -m1 -iE 'error|fail' "$tmp/$b.out" | cut -c1-160)"
done
broken mode 's/defaultMode: 0400/defaultMode: 0444/' grpo-job.yaml
broken dns 's/baton-grpo-0\.baton-grpo/baton-grpo-0/' grpo-job.yaml
for b in mode dns; do
  schemas "$tmp/$b"/*.yaml
  if fit "$tmp/$b" >"$tmp/$b.out"; then
    echo "FAILED: a broken Job ($b) passed the fit check"
    exit 1
  fi
  echo "a broken Job ($b) is refused: $(head -1 "$tmp/$b.out")"
done
