#!/usr/bin/env bash
# The master's part of docs/admin.md "Provisioning real hosts", between installing Salt and the
# first highstate: the site pillar in /srv/pillar, the cluster's image registry, every
# node's minion answering, and the package's modules synced (the master restarted so its
# job controller runs them). Arguments: the nodes' minion ids.
set -euo pipefail
(($#)) || { echo "usage: $0 NODE..." >&2; exit 2; }
nodes=$(IFS=,; echo "$*")
log() { printf '[master-setup %(%H:%M:%S)T] %s\n' -1 "$*"; }

# Vagrant's file provisioner put these in /tmp; a later `vagrant provision` uploads again.
install -d -m 0750 /srv/pillar
cp -r /tmp/dockermpi-pillar/. /srv/pillar/
install -m 0640 /tmp/dockermpi-storage.sls /srv/pillar/dockermpi_storage.sls
rm -rf /tmp/dockermpi-pillar /tmp/dockermpi-storage.sls

# The registry images are approved from (Debian's docker-registry, plain HTTP on the
# cluster network; the nodes trust it through pillar mpi:docker:insecure_registries):
# read-only on port 5000 for the cluster, writable on 5001 for the machine that builds
# the images (its forwarded port) and no address of the cluster network.
if ! dpkg -s docker-registry >/dev/null 2>&1; then
    log "installing docker-registry"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        docker-registry iptables >/dev/null
fi
install -m 0644 /tmp/dockermpi-registry.yml /etc/docker/registry/config.yml
install -m 0644 /tmp/dockermpi-registry-push.yml /etc/docker/registry/push.yml
install -m 0644 /tmp/dockermpi-registry-push.service /etc/systemd/system/dockermpi-registry-push.service
cluster_network=${DMPI_CLUSTER_NETWORK:?} push_from=${DMPI_PUSH_FROM:?}
printf 'CLUSTER_NETWORK=%s\nPUSH_FROM=%s\n' "$cluster_network" "$push_from" \
    >/etc/default/dockermpi-registry-push
rm -f /tmp/dockermpi-registry.yml /tmp/dockermpi-registry-push.yml /tmp/dockermpi-registry-push.service
chown docker-registry: /var/lib/docker-registry
systemctl daemon-reload
systemctl enable --quiet docker-registry dockermpi-registry-push
systemctl restart docker-registry dockermpi-registry-push

wait_for_nodes() {
    local deadline=$((SECONDS + $1)) answers
    while :; do
        answers=$(salt -L "$nodes" test.ping --timeout=5 --out=json --static 2>/dev/null || true)
        silent=$(python3 -c 'import json, sys
answers = json.loads(sys.argv[1] or "{}")
print(" ".join(n for n in sys.argv[2].split(",") if answers.get(n) is not True))' "$answers" "$nodes")
        [[ -z $silent ]] && return 0
        ((SECONDS < deadline)) || { log "minions not answering after $1 s: $silent" >&2; return 1; }
        sleep 2
    done
}
log "waiting for the minions of $nodes (keys preseeded)"
wait_for_nodes 300

log "salt-run saltutil.sync_all; restarting salt-master so the job controller runs the synced modules"
salt-run saltutil.sync_all >/dev/null
systemctl restart salt-master
wait_for_nodes 120
salt -L "$nodes" saltutil.sync_all >/dev/null
# docs/admin.md: the NFS server's highstate first, so its export exists before any node mounts it.
if salt -G roles:mpi-nfs-server test.ping --out=json --static 2>/dev/null | grep -q true; then
    log "highstate on the NFS server first"
    salt -G roles:mpi-nfs-server state.apply --state-output=terse --state-verbose=False
fi
log "master ready: $(salt-run manage.up --out=txt 2>/dev/null | tr '\n' ' ')"
