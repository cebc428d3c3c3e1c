#!/usr/bin/env bash
# docs/admin.md's workflow for a new image, after the host pushed it: approve it by digest in
# the site pillar, apply dockermpi.images on every node (each pulls and checks the
# digest), then wait until the job controller hears every node, and give the demo user pi.py.
# Arguments: the image's short name, its reference pinned by digest, the nodes' minion ids.
set -euo pipefail
(($# >= 3)) || { echo "usage: $0 NAME REGISTRY/REPO@sha256:DIGEST NODE..." >&2; exit 2; }
name=$1 reference=$2
shift 2
nodes=$(IFS=,; echo "$*")
log() { printf '[cluster-ready %(%H:%M:%S)T] %s\n' -1 "$*"; }
json_field() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }

# Every node's minion restarts once after its first highstate (for its mpi_node engine):
# wait until the job controller hears all of them.
wait_for_engine() {
    local deadline=$((SECONDS + $1)) found silent
    while :; do
        found=$(salt-run mpi.nodes --out=json 2>/dev/null || true)
        silent=$(python3 -c 'import json, sys
try:
    found = json.loads(sys.argv[1])
except ValueError:
    found = {}
found = found if isinstance(found, dict) else {}
print(" ".join(n for n in sys.argv[2].split(",")
               if not isinstance(found.get(n), dict) or not found[n].get("reachable")))' \
            "$found" "$nodes")
        [[ -z $silent ]] && return 0
        ((SECONDS < deadline)) || { log "the job controller does not hear $silent" >&2; return 1; }
        sleep 2
    done
}
log "waiting for the job controller to hear $nodes"
wait_for_engine 180

log "approving $name = $reference"
printf 'mpi:\n  images:\n    %s: %s\n' "$name" "$reference" >/srv/pillar/dockermpi_images.sls
salt -L "$nodes" saltutil.refresh_pillar wait=True >/dev/null
salt -L "$nodes" state.apply dockermpi.images --state-output=terse --state-verbose=False
wait_for_engine 60

# The demo user's program, in their own directory on the shared storage, owned by them.
account=$(salt-run mpi.add_user demo --out=json 2>/dev/null)
uid=$(json_field "$account" uid) gid=$(json_field "$account" gid) dir=$(json_field "$account" dir)
first=${nodes%%,*}
salt-cp "$first" /tmp/dockermpi-pi.py /var/tmp/dockermpi-pi.py >/dev/null
salt "$first" cmd.run python_shell=False \
    "[setpriv, --reuid=$uid, --regid=$gid, --clear-groups, --, cp, /var/tmp/dockermpi-pi.py, $dir/pi.py]"
summary=$(salt-run mpi.nodes --out=json 2>/dev/null | python3 -c 'import json, sys
nodes = json.load(sys.stdin)
print(", ".join(name + ": " + str(node["slots"]) + " slots" for name, node in sorted(nodes.items())))')
log "cluster ready: $summary"
