#!/usr/bin/env bash
# Vagrant's Salt provisioner runs this instead of the upstream bootstrap-salt.sh, which
# downloads Salt from the internet. It installs Salt the way docs/admin.md "Provisioning real
# hosts" says (a venv at /opt/saltstack/salt from a wheelhouse, pinned by
# images/host/requirements.txt, systemd units from images/host), offline, then applies
# the configuration the provisioner uploaded. It takes the upstream options Vagrant passes:
#   -c DIR  uploaded master, minion, grains, *.pem/*.pub     -C  configure only
#   -j JSON minion settings   -k DIR  minion keys to seed      -M  master   -N  no minion
#   -F      (overwrite config: always the case here)
set -euo pipefail
wheelhouse=/var/cache/dockermpi/wheelhouse   # synced from the host (Vagrantfile)
host_files=/var/cache/dockermpi/host         # images/host: requirements.txt, *.service
venv=/opt/saltstack/salt
log() { printf '[bootstrap-salt %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { log "$*" >&2; exit 1; }

config_dir='' configure_only=0 minion_json='' seed_dir='' master=0 minion=1
while getopts 'c:Cj:k:MNFx:' option; do
    case $option in
        c) config_dir=$OPTARG ;;
        C) configure_only=1 ;;
        j) minion_json=$OPTARG ;;
        k) seed_dir=$OPTARG ;;
        M) master=1 ;;
        N) minion=0 ;;
        F) ;;
        x) die "-x (python version) is not supported: Salt runs on the host's python3" ;;
        *) die "unknown option -$OPTARG" ;;
    esac
done

install_salt() {
    compgen -G "$wheelhouse/salt-*.whl" >/dev/null \
        || die "no Salt wheel in $wheelhouse: run tests/vagrant/dmpi-vagrant setup-host on the host"
    log "installing python3-venv and Salt from $wheelhouse"
    if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            python3-venv >/dev/null
    fi
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --no-index \
        --find-links "$wheelhouse" -r "$host_files/requirements.txt"
    install -m 0644 "$host_files/salt-master.service" "$host_files/salt-minion.service" \
        /etc/systemd/system/
    systemctl daemon-reload
}

installed_version() { "$venv/bin/python" -c 'import salt.version; print(salt.version.__version__)' 2>/dev/null; }
wanted=$(sed -n 's/^salt==//p' "$host_files/requirements.txt")
if [[ $(installed_version) != "$wanted" ]]; then
    ((configure_only)) && log "Salt $wanted is not installed although -C was given; installing it"
    install_salt
fi
[[ $(installed_version) == "$wanted" ]] || die "Salt $wanted did not install"
for tool in salt salt-call salt-cp salt-key salt-master salt-minion salt-run; do
    ln -sf "$venv/bin/$tool" "/usr/bin/$tool"
done

mkdir -p /etc/salt/master.d /etc/salt/minion.d
if ((master)); then
    # docs/admin.md: the package's master config goes to /etc/salt/master.d/dockermpi.conf.
    [[ -n $config_dir && -f $config_dir/master ]] && install -m 0644 "$config_dir/master" \
        /etc/salt/master.d/dockermpi.conf
    if [[ -n $seed_dir ]]; then
        install -d -m 0700 /etc/salt/pki/master/minions
        for key in "$seed_dir"/*; do
            [[ -f $key ]] && install -m 0644 "$key" "/etc/salt/pki/master/minions/$(basename "$key")"
        done
    fi
    systemctl enable --quiet salt-master
    systemctl restart salt-master
    log "salt-master $wanted running"
fi
if ((minion)); then
    [[ -n $minion_json ]] && printf '%s\n' "$minion_json" >/etc/salt/minion.d/vagrant.conf
    [[ -n $config_dir && -f $config_dir/minion ]] && install -m 0644 "$config_dir/minion" \
        /etc/salt/minion.d/site.conf
    [[ -n $config_dir && -f $config_dir/grains ]] && install -m 0644 "$config_dir/grains" /etc/salt/grains
    if [[ -n $config_dir && -f $config_dir/minion.pem ]]; then
        install -d -m 0700 /etc/salt/pki/minion
        install -m 0400 "$config_dir/minion.pem" /etc/salt/pki/minion/minion.pem
        install -m 0644 "$config_dir/minion.pub" /etc/salt/pki/minion/minion.pub
        rm -f "$config_dir/minion.pem"
    fi
    systemctl enable --quiet salt-minion
    systemctl restart salt-minion
    log "salt-minion $wanted running"
fi
