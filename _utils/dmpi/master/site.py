"""
The master's reach into the cluster, through Salt: the job store, calls to nodes, the
event bus, which minions are MPI nodes, and the site's settings as the nodes see them.

One :class:`Site` per process, made from the master's ``opts``: the ``mpi`` runner
makes one per ``salt-run``, the ``mpi_api`` engine one for its life. What users and
admins may ask of it is in :mod:`dmpi.master.user_calls` and
:mod:`dmpi.master.admin_calls`.

Refusals raise :class:`~dmpi.errors.RequestError` (the caller's input) and
:class:`~dmpi.errors.ClusterError` (what the cluster cannot do now).
"""

import copy
import ipaddress
import json
import os
import threading
import time

import dmpi.seal
import dmpi.settings
import salt.cache
import salt.client
import salt.fileclient
import salt.pillar
import salt.utils.event
import salt.utils.minions
import salt.utils.yaml
from dmpi.contract import NODE_ROLE, NODES_CHANGED_TAG, job_tag
from dmpi.errors import ClusterError, ConfigError, RequestError, StoreError
from dmpi.jobs import rules
from dmpi.jobs import store as job_store
from dmpi.storage import quota

NODE_TARGET = f"G@roles:{NODE_ROLE}"
DEFAULTS_FILE = "dockermpi/defaults.yaml"
# Seconds a rendering of the settings is used again while none of its sources changed:
# a bound on what no file here shows (a pillar that reads something else as it renders).
SETTINGS_REUSE = 60
# Seconds the storage's quota figures are shown again before it is asked anew: users
# polling mpi.usage must not each cost the storage server a quota scan.
STORAGE_USAGE_REUSE = 10
GLUSTERFS_SERVER_ROLE = "mpi-glusterfs-server"


class Site:
    """The cluster as the master sees it, through Salt (see the module's text); also the
    job controller's transport (:class:`~dmpi.master.controller.JobController`)."""

    def __init__(self, opts):
        self.opts = opts
        self._thread = threading.local()  # each thread's LocalClient
        self._settings = {}  # minion -> (sources, when rendered, settings)
        self._storage_usage = {}  # volume -> (when read, by user)
        self._storage_usage_lock = threading.Lock()

    # ------------------------------------------------------------ store and bus

    def store(self):
        """The job store in the master's cache directory (``dmpi.jobs.store``)."""
        return job_store.open_store(
            os.path.join(self.opts["cachedir"], "dockermpi", "jobs.sqlite"))

    def fire(self, tag, data):
        """Put one event on the master's bus."""
        with salt.utils.event.get_master_event(self.opts, self.opts["sock_dir"],
                                               listen=False) as bus:
            bus.fire_event(data, tag)

    def fire_job(self, job_id, state, data=None):
        """Announce a job's request or transition (``mpi/job/<id>/<state>``)."""
        self.fire(job_tag(job_id, state), dict(data or {}, job_id=job_id, state=state))

    def nodes_changed(self):
        """Tell the job controller that an admin drained or resumed a node, or that a
        self-test judged nodes."""
        self.fire(NODES_CHANGED_TAG, {})

    def job_events(self):
        """A listening connection to the master's event bus (a context manager)."""
        return salt.utils.event.get_master_event(self.opts, self.opts["sock_dir"],
                                                 listen=True)

    # ---------------------------------------------------------------- nodes

    def client(self):
        """This thread's LocalClient, made once: making one costs more than most calls
        made with it (the user API follows jobs' output with a call a second per
        stream)."""
        client = getattr(self._thread, "client", None)
        if client is None:
            client = self._thread.client = salt.client.get_local_client(mopts=self.opts)
        return client

    def call(self, minions, fun, timeout, **kwargs):
        """Run ``fun`` on ``minions`` in parallel; ``{minion: return}``; ClusterError
        naming every minion that failed (``answered``: those that did not)."""
        returns = self.client().cmd(list(minions), fun, kwarg=kwargs, tgt_type="list",
                                    timeout=timeout, full_return=True)
        results, errors = minion_returns(returns, minions)
        if errors:
            raise ClusterError(failed_calls_message(fun, errors), list(results))
        return results

    def call_async(self, minions, fun, **kwargs):
        """Publish ``fun`` to ``minions`` and return at once."""
        self.client().cmd_async(list(minions), fun, tgt_type="list", kwarg=kwargs)

    def seal_for(self, minion, value):
        """``value`` (JSON) sealed to the minion's accepted Salt key (``dmpi.seal``):
        what a publish carries of users' secrets is then ciphertext in the job cache and
        on the bus."""
        return dmpi.seal.seal(os.path.join(self.opts["pki_dir"], "minions", minion),
                              json.dumps(value).encode())

    def host_addresses(self, minions, network):
        """Each minion's address in ``network`` (the cluster network), from its grains."""
        net = ipaddress.ip_network(network)
        addresses = {}
        for minion in minions:
            found = [a for a in (self.grains(minion) or {}).get("ipv4", [])
                     if ipaddress.ip_address(a) in net]
            if not found:
                raise ClusterError(f"{minion} has no address in the cluster network {network}")
            addresses[minion] = found[0]
        return addresses

    def grains(self, minion):
        """The minion's grains as the master last received them (None when it holds
        none)."""
        return salt.cache.factory(self.opts).fetch("grains", minion) or None

    def opened(self, sealed, node):
        """What a node sealed to the master's key (``dmpi.seal``), opened: what nodes
        read of users' output crosses the job cache and the bus only as ciphertext."""
        try:
            return json.loads(dmpi.seal.unseal(
                os.path.join(self.opts["pki_dir"], "master.pem"), sealed))
        except (OSError, ValueError) as exc:
            raise ClusterError(f"{node} answered with data the master cannot open: "
                               f"{exc}") from exc

    def targeted(self, target):
        """Minion ids a compound target matches, from the master's cache (no network)."""
        return sorted(salt.utils.minions.CkMinions(self.opts).check_minions(
            target, "compound")["minions"])

    def mpi_nodes(self):
        """Every minion that is an MPI node (grain ``roles:mpi-node``)."""
        return self.targeted(NODE_TARGET)

    def mpi_nodes_required(self):
        """:meth:`mpi_nodes`; RequestError when there is none (no job could run, and no
        node's settings can be read)."""
        found = self.mpi_nodes()
        if not found:
            raise RequestError("there are no MPI nodes (grain roles:mpi-node)")
        return found

    def alive(self, now=None):
        """The nodes reporting now."""
        return rules.alive(self.store().nodes(), time.time() if now is None else now)

    def candidates(self, nodes, all_nodes):
        """(candidate node ids, exact node count or None) for a parsed ``nodes``
        argument (``dmpi.jobs.request``): a count, a node list or one grain match;
        never pillar or another target type."""
        if nodes is None:
            return all_nodes, None
        if "count" in nodes:
            if nodes["count"] > len(all_nodes):
                raise RequestError(
                    f"nodes={nodes['count']} but only {len(all_nodes)} MPI nodes exist")
            return all_nodes, nodes["count"]
        if "grain" in nodes:
            found = self.targeted(f"{NODE_TARGET} and G@{nodes['grain']}")
            if not found:
                raise RequestError(f"no MPI node has the grain G@{nodes['grain']}")
            return found, None
        unknown = sorted(set(nodes["list"]) - set(all_nodes))
        if unknown:
            raise RequestError(f"nodes not known as MPI nodes (not reachable?): {unknown}")
        return list(nodes["list"]), None

    def storage_owner(self, config):
        """(minion, storage path there) of the host that is root on the shared storage:
        the NFS server for NFS (its export), any reporting node for a cluster file
        system."""
        storage = config["storage"]
        if storage["type"] == "nfs":
            found = self.targeted("G@roles:mpi-nfs-server")
            if not found:
                raise ClusterError("no minion has the role mpi-nfs-server")
            return found[0], storage["nfs"]["export"]
        alive = sorted(self.alive())
        if not alive:
            raise ClusterError("no MPI node is reporting; cannot reach shared storage")
        return alive[0], storage["path"]

    def storage_server(self, config):
        """The minion serving the GlusterFS volume (role mpi-glusterfs-server), which
        sets and reads users' quotas; None for a storage type without them."""
        if config["storage"]["type"] != "glusterfs":
            return None
        found = self.targeted(f"G@roles:{GLUSTERFS_SERVER_ROLE}")
        if not found:
            raise ClusterError(f"no minion has the role {GLUSTERFS_SERVER_ROLE}")
        return found[0]

    def set_user_quota(self, config, user):
        """Put ``users/<user>`` under its quota (``mpi:storage:quota``) where the storage
        enforces quotas; nothing elsewhere."""
        server = self.storage_server(config)
        if server is None:
            return
        size_mb, files = quota.limits(config["storage"]["quota"], user)
        self.call([server], "mpi_storage.set_quota", timeout=60,
                  volume=config["storage"]["glusterfs"]["volume"],
                  path=quota.user_path(user), size_mb=size_mb, files=files)

    def storage_usage(self, config):
        """``{user: {"bytes_used", "bytes_limit", "files_used", "files_limit"}}`` of
        every user directory under a quota, as the storage counts it; None for a storage
        type without quotas. Read again at most every :data:`STORAGE_USAGE_REUSE` s."""
        server = self.storage_server(config)
        if server is None:
            return None
        volume = config["storage"]["glusterfs"]["volume"]
        with self._storage_usage_lock:
            kept = self._storage_usage.get(volume)
            if kept and time.monotonic() - kept[0] < STORAGE_USAGE_REUSE:
                return kept[1]
        found = self.call([server], "mpi_storage.quota_usage", timeout=30,
                          volume=volume)[server]
        by_user = quota.by_user(found)
        with self._storage_usage_lock:
            self._storage_usage[volume] = (time.monotonic(), by_user)
        return by_user

    def user_uid(self, config, user, check_dir=False, identity=None):
        """The user's own uid (allocated on first use from ``mpi:users``, bound to the
        hub ``identity`` when one calls), with their directory owned by it (made once,
        or checked again with ``check_dir``: a job that finds it gone resets that)."""
        store = self.store()
        users = config["users"]
        try:
            uid, _ = store.user_uid(user, int(users["uid_min"]), int(users["uid_max"]),
                                    identity=identity)
        except StoreError as exc:  # uid range used up, name taken
            raise ClusterError(str(exc)) from None
        if check_dir or not store.users().get(user, {}).get("dir_ready"):
            minion, path = self.storage_owner(config)
            self.call([minion], "mpi_job.ensure_user_dir", timeout=15, storage_path=path,
                      user=user, uid=uid, gid=uid)
            # Before the directory counts as ready: no job writes into it unlimited.
            self.set_user_quota(config, user)
            store.set_user_dir_ready(user)
        return uid

    # ------------------------------------------------------------- settings

    def settings(self, fresh=False):
        """The site's settings read now, as the nodes see them, handed to the job
        controller (in the store) when they are not what it has. ``fresh`` renders them
        whatever was rendered before."""
        return self.node_settings(self.mpi_nodes_required()[0], fresh)

    def node_settings(self, minion, fresh=False):
        """:meth:`settings` as ``minion`` sees them."""
        config = self._rendered_settings(minion, fresh)
        store = self.store()
        if fresh or (store.get_meta("site") or {}).get("config") != config:
            store.set_meta("site", {"config": config, "read": time.time()})
        return config

    def _rendered_settings(self, minion, fresh):
        """The node's pillar merged over the defaults and checked (:mod:`dmpi.settings`);
        ClusterError naming every problem of a bad pillar. A rendering is used again
        while nothing it was rendered from changed, for at most SETTINGS_REUSE seconds
        (rendering a node's pillar costs a tenth of a second of CPU, and every submit,
        whoami and images call needs the settings)."""
        grains = self.grains(minion)
        sources = self._settings_sources(grains)
        kept = self._settings.get(minion)
        if not fresh and sources is not None and kept and kept[0] == sources \
                and time.monotonic() - kept[1] < SETTINGS_REUSE:
            return copy.deepcopy(kept[2])
        pillar = self._node_pillar(minion, grains)
        try:
            config = dmpi.settings.validate(
                dmpi.settings.merge(self._defaults(), pillar.get("mpi")))
        except ConfigError as exc:
            raise ClusterError(
                f"the site's mpi pillar is invalid, so no job can be accepted:\n{exc}"
            ) from None
        if sources is not None:
            self._settings[minion] = (sources, time.monotonic(), copy.deepcopy(config))
        return config

    def _defaults(self):
        client = salt.fileclient.FSClient(self.opts)
        try:
            path = client.cache_file(f"salt://{DEFAULTS_FILE}")
        finally:
            client.destroy()
        if not path:
            raise ClusterError(f"salt://{DEFAULTS_FILE} is not on the master's file server")
        with open(path, encoding="utf-8") as handle:
            return salt.utils.yaml.safe_load(handle)["mpi"]

    def _node_pillar(self, minion, grains):
        """The pillar the master renders for a node now: its pillar tree over the
        node's grains (as Salt's ``pillar.show_pillar`` does, ``{"fqdn": id}`` when the
        master holds none). Never the pillar the master cached for the node, nor
        written there: a dry run with ``pillar=...`` (``state.apply test=True
        pillar=...``) leaves its override there until the next refresh."""
        saltenv = self.opts.get("pillarenv") or self.opts.get("saltenv") or "base"
        # salt.pillar.Pillar itself, not get_pillar's PillarCache: reading the settings
        # (every minute by the job controller) must not write the master's cache of the
        # node's pillar.
        pillar = salt.pillar.Pillar(self.opts, grains or {"fqdn": minion}, minion, saltenv,
                                    pillarenv=self.opts.get("pillarenv"))
        rendered = pillar.compile_pillar()
        if rendered.get("_errors"):
            raise ClusterError(
                f"the pillar of {minion} does not render, so no job can be accepted: "
                + "; ".join(str(e) for e in rendered["_errors"]))
        return rendered

    def _settings_sources(self, grains):
        """What the settings are rendered from, to tell when a rendering is still good:
        every file under the pillar roots, the formula's defaults file in the file
        roots, the node's grains. None when the master has sources of pillar or files
        that files here cannot speak for (ext_pillar, a file server backend other than
        roots): then the settings are rendered every time."""
        opts = self.opts
        if opts.get("ext_pillar") or list(opts.get("fileserver_backend") or ["roots"]) \
                != ["roots"]:
            return None
        saltenv = opts.get("saltenv") or "base"
        file_roots = (opts.get("file_roots") or {}).get(saltenv) or []
        defaults = [os.path.join(root, DEFAULTS_FILE) for root in file_roots]
        pillar_roots = [root for roots in (opts.get("pillar_roots") or {}).values()
                        for root in roots]
        return json.dumps([_file_stats(pillar_roots), _file_stats(defaults), grains],
                          sort_keys=True, default=str)


def _file_stats(paths):
    """(path, inode, size, mtime, ctime) of each of ``paths`` that is a file and of every
    file under those that are directories, in order: any write, replacement or removal
    changes them (ctime whatever a writer sets mtime to); a path that is missing is
    (path, None)."""
    stats = []

    def add(path):
        try:
            found = os.stat(path)
        except OSError:
            stats.append((path, None))
            return
        stats.append((path, found.st_ino, found.st_size, found.st_mtime_ns,
                      found.st_ctime_ns))

    for top in paths:
        if not os.path.isdir(top):
            add(top)
            continue
        for directory, dirs, files in os.walk(top):
            dirs.sort()
            for name in sorted(files):
                add(os.path.join(directory, name))
    return stats


def minion_returns(returns, minions):
    """Sort a ``LocalClient.cmd(..., full_return=True)`` answer: ``(results, errors)``,
    ``{minion: return}`` of those that succeeded and ``{minion: why}`` of the others
    (no answer, a non-zero retcode, or ``success`` false)."""
    results, errors = {}, {}
    for minion in minions:
        answer = returns.get(minion)
        if not isinstance(answer, dict) or "ret" not in answer:
            errors[minion] = "did not answer"
        elif answer.get("retcode", 0) != 0 or answer.get("success") is False:
            errors[minion] = str(answer["ret"])
        else:
            results[minion] = answer["ret"]
    return results, errors


def failed_calls_message(fun, errors):
    """One line naming each minion a call of ``fun`` failed on, and why."""
    return f"{fun} failed on " + "; ".join(f"{m}: {e}" for m, e in sorted(errors.items()))
