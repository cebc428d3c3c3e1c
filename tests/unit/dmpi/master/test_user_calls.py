"""What users may ask of the master (``dmpi.master.user_calls``), over a real job store:
a hub user acts as themselves only, and another user's job is "no such job" to them, as a
job that does not exist; an admin sees and names anyone. The cluster side of the
:class:`~dmpi.master.site.Site` (minion lists, calls to nodes, the event bus) is a
subclass that records instead of reaching Salt."""

import ast
import contextlib
import pathlib
import time

import dmpi.settings
import pytest
import yaml
from dmpi.errors import ClusterError, DockerMPIError, NoSuchJob, RequestError
from dmpi.master import admin_calls, user_calls
from dmpi.master.site import Site

REPO = pathlib.Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((REPO / "salt/dockermpi/defaults.yaml").read_text())["mpi"]
IMAGE = "10.251.1.2:5000/dockermpi/mpi@sha256:" + "0123456789abcdef" * 4
CONFIG = dmpi.settings.validate(dmpi.settings.merge(DEFAULTS, {
    "cluster_network": "10.251.1.0/24", "job_network": {"addresses": "10.251.1.128/25"},
    "storage": {"type": "nfs", "nfs": {"server": "10.251.1.10"}}, "images": {"mpi": IMAGE},
    "slots_per_node": 2}))
ALICE = user_calls.hub_user("alice")
BOB = user_calls.hub_user("bob")


class LocalSite(Site):
    """A Site with a real store in ``cachedir`` whose cluster is two reporting nodes that
    hold ``outputs``; what would reach Salt is recorded in ``events`` and ``node_calls``."""

    def __init__(self, cachedir):
        super().__init__({"cachedir": str(cachedir)})
        self.events, self.node_calls, self.outputs = [], [], {}

    def mpi_nodes(self):
        return ["node1", "node2"]

    def alive(self, now=None):
        return {"node1", "node2"}

    def node_settings(self, minion, fresh=False):
        return CONFIG

    def settings(self, fresh=False):
        return CONFIG

    def user_uid(self, config, user, check_dir=False, identity=None):
        uid, _ = self.store().user_uid(user, 100000, 100100, identity=identity)
        return uid

    def fire(self, tag, data):
        self.events.append(tag)

    def call(self, minions, fun, timeout, **kwargs):
        self.node_calls.append((fun, kwargs))
        return {minions[0]: self.outputs[kwargs["job_id"]]}

    def opened(self, sealed, node):
        return sealed

    @contextlib.contextmanager
    def job_events(self):
        yield NoEvents()


class NoEvents:
    """A bus on which nothing happens: waits end by their timeout."""

    def subscribe(self, tag):
        pass

    def get_event(self, wait, tag, match_type):
        return None


@pytest.fixture
def site(tmp_path):
    site = LocalSite(tmp_path)
    site.store().set_meta("engine", {"pid_alive": time.time()})
    return site


def _submit(site, caller, **kwargs):
    job = dict(image="mpi", np=2, cmd=["hostname"])
    job.update(kwargs)
    return user_calls.submit(site, caller, **job)


@pytest.fixture
def jobs(site):
    """(alice's job id, bob's job id), each queued by its own user."""
    alice = _submit(site, ALICE)["job_id"]
    bob = _submit(site, BOB)["job_id"]
    site.outputs = {alice: {"data": "alice's output", "offset": 14},
                    bob: {"data": "bob's secret output", "offset": 19}}
    site.events.clear()
    return alice, bob


def test_a_hub_users_job_is_theirs_under_their_mapped_name(site):
    ann = user_calls.hub_user("Ann.Lee@example.org")
    queued = _submit(site, ann)
    mapped = dmpi.settings.user_for_identity("Ann.Lee@example.org")
    assert queued["state"] == "queued" and queued["user"] == mapped
    assert site.store().users()[mapped]["identity"] == "Ann.Lee@example.org"
    assert site.events == [f"mpi/job/{queued['job_id']}/queued"]


@pytest.mark.parametrize("call", [
    lambda site, job: user_calls.status(site, ALICE, job),
    lambda site, job: user_calls.wait(site, ALICE, job, timeout=0),
    lambda site, job: user_calls.cancel(site, ALICE, job),
    lambda site, job: user_calls.logs(site, ALICE, job),
    lambda site, job: user_calls.logs(site, ALICE, job, stream="stderr", offset=0),
    lambda site, job: user_calls.list_jobs(site, ALICE, after=job),
    lambda site, job: user_calls.history(site, ALICE, after=job),
])
def test_another_users_job_is_no_such_job_and_stays_untouched(site, jobs, call):
    _, bob_job = jobs
    with pytest.raises(NoSuchJob) as theirs:
        call(site, bob_job)
    with pytest.raises(NoSuchJob) as missing:
        call(site, "20991231-000000-ffffff")
    # Alice cannot tell bob's job from one that does not exist.
    assert str(theirs.value) == str(missing.value).replace("20991231-000000-ffffff", bob_job)
    record = site.store().get(bob_job)
    assert record["state"] == "queued" and not record.get("cancel_requested")
    assert site.events == [] and site.node_calls == []


def test_a_hub_user_lists_and_reads_only_their_own(site, jobs):
    alice_job, bob_job = jobs
    assert [j["job_id"] for j in user_calls.list_jobs(site, ALICE)] == [alice_job]
    assert user_calls.status(site, ALICE, alice_job)["user"] == "alice"
    assert user_calls.logs(site, ALICE, alice_job)["data"] == "alice's output"
    assert [j["job_id"] for j in user_calls.list_jobs(site, user_calls.ADMIN)] == \
        [alice_job, bob_job]


def test_usage_shows_each_users_fair_share_standing_a_hub_user_only_their_own(site, jobs):
    # carol ran a lot lately; alice and bob have queued jobs and no usage.
    site.store().set_meta("fair_usage", {"carol": [36000.0, time.time()]})
    standing = user_calls.usage(site, user_calls.ADMIN)["fair_share"]
    assert set(standing) == {"alice", "bob", "carol"}
    assert standing["alice"] == {"decayed_core_hours": 0.0, "fairshare": 1.0}
    assert standing["carol"]["fairshare"] == 0.125  # all usage hers, a third the share
    assert 9.99 < standing["carol"]["decayed_core_hours"] <= 10.0
    assert user_calls.usage(site, ALICE)["fair_share"] == {"alice": standing["alice"]}
    # a closed window is accounting only
    assert "fair_share" not in user_calls.usage(site, ALICE, until=time.time())


def test_history_is_the_callers_jobs_that_ended_in_the_window_oldest_first(site, jobs):
    alice_job, bob_job = jobs
    store = site.store()
    store.transition(alice_job, "failed", ended=2000.0)
    store.transition(bob_job, "succeeded", ended=2500.0)
    assert [r["job_id"] for r in user_calls.history(site, ALICE)] == [alice_job]
    assert user_calls.history(site, ALICE, since=2000.5) == []
    assert user_calls.history(site, ALICE, until=2000.0) == []  # the end is open
    assert [r["job_id"] for r in user_calls.history(
        site, user_calls.ADMIN, since=1000, until=3000)] == [alice_job, bob_job]
    assert [r["job_id"] for r in user_calls.history(
        site, user_calls.ADMIN, since="1970-01-01T00:40")] == [bob_job]  # 2400 s


def test_a_history_and_a_list_come_in_pages_in_submission_order(site, jobs):
    alice_job, bob_job = jobs
    more = [_submit(site, ALICE)["job_id"] for _ in range(3)]
    store = site.store()
    for job_id, ended in zip([*more, alice_job], (4000.0, 3000.0, 2000.0, 1000.0)):
        store.transition(job_id, "failed", ended=ended)  # ended in the other order
    store.transition(bob_job, "failed", ended=2500.0)
    pages, after = [], None
    while True:
        page = user_calls.history(site, ALICE, limit=2, after=after)
        pages.append([row["job_id"] for row in page])
        if len(page) < 2:
            break
        after = page[-1]["job_id"]
    assert pages == [[alice_job, more[0]], [more[1], more[2]], []]
    assert [row["job_id"] for row in user_calls.history(
        site, user_calls.ADMIN, limit=2, after=more[0])] == [more[1], more[2]]
    assert [j["job_id"] for j in user_calls.list_jobs(site, ALICE, state="failed", limit=1,
                                                      after=more[1])] == [more[2]]
    assert user_calls.history(site, ALICE, since=2500, limit=1, after=more[0]) == \
        user_calls.history(site, ALICE, since=2500)[1:2]


@pytest.mark.parametrize("limit", [0, -1, "two", 1.5, True, [1]])
def test_a_page_of_no_whole_number_of_jobs_is_refused(site, jobs, limit):
    with pytest.raises(RequestError, match="limit must be a whole number of jobs"):
        user_calls.history(site, ALICE, limit=limit)
    with pytest.raises(RequestError, match="limit must be a whole number of jobs"):
        user_calls.list_jobs(site, ALICE, limit=limit)


GLUSTER_CONFIG = dmpi.settings.validate(dmpi.settings.merge(CONFIG, {"storage": {
    "type": "glusterfs", "glusterfs": {"server": "10.251.1.6"},
    "quota": {"size_mb": 100, "files": 1000, "users": {"bob": {"size_mb": 5}}}}}))
QUOTA_FIGURES = {
    "/users/alice": {"bytes_used": 10, "bytes_limit": 100 << 20, "files_used": 3,
                     "files_limit": 1000},
    "/users/bob": {"bytes_used": 5 << 20, "bytes_limit": 5 << 20, "files_used": 9,
                   "files_limit": 1000},
    "/scratch": {"bytes_used": 1, "bytes_limit": 2, "files_used": None, "files_limit": 0},
}


class GlusterSite(LocalSite):
    """A site on GlusterFS whose storage server answers ``answer`` (or fails)."""

    answer = QUOTA_FIGURES

    def settings(self, fresh=False):
        return GLUSTER_CONFIG

    def targeted(self, target):
        return ["storage"] if target == "G@roles:mpi-glusterfs-server" else []

    def call(self, minions, fun, timeout, **kwargs):
        self.node_calls.append((minions, fun, kwargs))
        if isinstance(self.answer, Exception):
            raise self.answer
        return {minions[0]: self.answer if fun == "mpi_storage.quota_usage" else []}


def test_usage_shows_each_users_quota_a_hub_user_only_their_own(tmp_path):
    site = GlusterSite(tmp_path)
    site.store().set_meta("engine", {"pid_alive": time.time()})
    assert user_calls.usage(site, user_calls.ADMIN)["storage"] == {
        "alice": QUOTA_FIGURES["/users/alice"], "bob": QUOTA_FIGURES["/users/bob"]}
    assert user_calls.usage(site, ALICE)["storage"] == {"alice": QUOTA_FIGURES["/users/alice"]}
    assert user_calls.usage(site, BOB)["storage"] == {"bob": QUOTA_FIGURES["/users/bob"]}
    # the storage server is asked at most every few seconds, whoever polls
    assert [fun for _, fun, _ in site.node_calls] == ["mpi_storage.quota_usage"]
    assert site.node_calls[0][2] == {"volume": "dockermpi"}


def test_usage_says_when_the_storage_does_not_answer_and_shows_the_rest(tmp_path):
    site = GlusterSite(tmp_path)
    site.store().set_meta("engine", {"pid_alive": time.time()})
    site.answer = ClusterError("storage: did not answer")
    found = user_calls.usage(site, ALICE)
    assert found["storage"] == {"error": "the storage's quota figures are not available: "
                                         "storage: did not answer"}
    assert "fair_share" in found and "users" in found


def test_usage_on_a_storage_without_quotas_has_no_storage_part(site):
    assert "storage" not in user_calls.usage(site, user_calls.ADMIN)


def test_a_new_users_directory_gets_its_quota_before_it_counts_as_ready(tmp_path):
    site = GlusterSite(tmp_path)
    site.alive = lambda now=None: {"node1"}
    Site.user_uid(site, GLUSTER_CONFIG, "bob")
    assert [(minions, fun) for minions, fun, _ in site.node_calls] == [
        (["node1"], "mpi_job.ensure_user_dir"), (["storage"], "mpi_storage.set_quota")]
    assert site.node_calls[1][2] == {"volume": "dockermpi", "path": "/users/bob",
                                     "size_mb": 5, "files": 1000}
    assert site.store().users()["bob"]["dir_ready"]
    site.node_calls.clear()
    Site.user_uid(site, GLUSTER_CONFIG, "bob")  # made once
    assert site.node_calls == []


@pytest.mark.parametrize("call", [
    lambda site: user_calls.list_jobs(site, ALICE, user="bob"),
    lambda site: user_calls.history(site, ALICE, user="bob"),
    lambda site: user_calls.usage(site, ALICE, user="bob"),
    lambda site: _submit(site, ALICE, user="bob"),
])
def test_a_hub_user_cannot_name_another_user(site, jobs, call):
    with pytest.raises(RequestError, match="a hub user's jobs always run as themselves"):
        call(site)
    assert len(site.store().jobs(None)) == 2 and site.events == []


def test_naming_themselves_is_allowed(site):
    assert _submit(site, ALICE, user="alice")["user"] == "alice"
    assert user_calls.list_jobs(site, ALICE, user="alice")[0]["user"] == "alice"


def test_an_admin_names_whom_a_job_is_for_and_sees_every_job(site, jobs):
    _, bob_job = jobs
    queued = _submit(site, user_calls.ADMIN, user="carol")
    assert queued["user"] == "carol"
    assert user_calls.status(site, user_calls.ADMIN, bob_job)["user"] == "bob"
    assert user_calls.whoami(site, user_calls.Caller(name="root")) == {
        "admin": True, "caller": "root"}


def test_a_hub_user_learns_who_they_are(site):
    assert user_calls.whoami(site, ALICE) == {
        "user": "alice", "account": "alice", "uid": 100000, "gid": 100000,
        "dir": "/srv/dockermpi/users/alice", "dir_in_job": "/data"}


@pytest.mark.parametrize("identity", ["", None, 5, "x" * 256])
def test_a_hub_user_needs_a_hub_name(identity):
    with pytest.raises(RequestError):
        user_calls.hub_user(identity)


@pytest.mark.parametrize("kwargs, words", [
    ({"image": "other"}, "image 'other' is not approved"),
    ({"np": 9}, "this job can never run"),
    ({"name": "../x"}, "is not a job name"),
    ({"nodes": "node7"}, "nodes not known as MPI nodes"),
    ({"origin": "cell 3"}, "origin 'cell 3' must map notebook"),
    ({"origin": {"notebook": "a.ipynb", "kernel": "k"}}, "must map notebook"),
    ({"origin": {"notebook": "\x1b]0;owned\x07.ipynb"}}, "is not a path of at most 512 "
                                                         "printable characters"),
    ({"origin": {"notebook": "n" * 513}}, "is not a path"),
    ({"origin": {"cell": True}}, "origin's cell 'True' is not a cell number"),
    ({"origin": {"cell": -1}}, "is not a cell number"),
])
def test_a_bad_submit_queues_nothing_and_says_why(site, kwargs, words):
    with pytest.raises(RequestError, match=words):
        _submit(site, ALICE, **kwargs)
    assert site.store().jobs(None) == [] and site.events == []


def test_a_job_keeps_the_notebook_and_cell_it_came_from(site):
    origin = {"notebook": "work/pi.ipynb", "cell": 7}
    queued = _submit(site, ALICE, origin=origin)
    assert queued["origin"] == origin
    assert user_calls.status(site, ALICE, queued["job_id"])["origin"] == origin
    assert _submit(site, ALICE, origin={"cell": 0})["origin"] == {"cell": 0}
    assert _submit(site, ALICE)["origin"] is None


def test_submit_refuses_while_the_job_controller_is_silent(site):
    site.store().set_meta("engine", {"pid_alive": time.time() - 600})
    with pytest.raises(ClusterError, match="job controller is not running"):
        _submit(site, ALICE)
    assert site.store().jobs(None) == []


def test_every_refusal_is_a_dockermpi_error(site, jobs):
    for call in (lambda: user_calls.status(site, ALICE, "not-a-job"),
                 lambda: user_calls.logs(site, ALICE, jobs[0], stream="stdin"),
                 lambda: user_calls.logs(site, ALICE, jobs[0], tail=0),
                 lambda: user_calls.history(site, ALICE, format="xml"),
                 lambda: user_calls.history(site, ALICE, since="yesterday"),
                 lambda: user_calls.list_jobs(site, ALICE, state="lost")):
        with pytest.raises(DockerMPIError):
            call()


def test_the_user_api_can_reach_user_calls_only():
    admin = {getattr(admin_calls, name) for name in dir(admin_calls)
             if callable(getattr(admin_calls, name)) and not name.startswith("_")}
    assert set(user_calls.CALLS) == {"submit", "submit_mpijob", "wait", "status", "list",
                                     "cancel", "logs", "history", "usage", "whoami",
                                     "images"}
    assert not admin & set(user_calls.CALLS.values())
    # The API engine imports no admin call: what it serves is user_calls.CALLS.
    api = ast.parse((REPO / "_engines" / "mpi_api.py").read_text())
    imported = {alias.name for node in ast.walk(api)
                if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert "admin_calls" not in imported and "dmpi.master.admin_calls" not in imported


# --------------------------------------------------------------------------- images

OPEN_MPI_4 = {"mpi": {"flavour": "openmpi4", "version": "4.1.4", "launcher": "/usr/bin/mpirun"},
              "commands": {"mpirun": "/usr/bin/mpirun", "sshd": "/usr/sbin/sshd"},
              "python3": "/usr/bin/python3", "python_version": "3.11.2", "mpi4py": "3.1.4",
              "os": "Debian GNU/Linux 12 (bookworm)", "glibc": "2.36", "problem": None}
OPEN_MPI_3 = dict(OPEN_MPI_4, mpi={"flavour": "openmpi", "version": "3.1.6",
                                   "launcher": "/opt/ompi3/bin/mpirun"}, mpi4py=None)


def _probed(site, facts, nodes=("node1", "node2")):
    site.store().nodes_seen({node: (time.time(), {"health": {
        "images": [IMAGE], "image_facts": {IMAGE: facts}}}) for node in nodes})


def test_images_say_what_the_probe_found(site):
    assert user_calls.images(site, ALICE)["images"] == [{
        "name": "mpi", "reference": IMAGE, "runs_jobs": None, "why_no_jobs": None,
        "why_one_node_only": None, "mpi": None, "flavour": None, "mpi_version": None, "launcher": None,
        "python3": None, "python_version": None, "mpi4py": None, "sshd": None, "os": None,
        "glibc": None, "probed_on": [], "mpi_from_pillar": False}]
    _probed(site, OPEN_MPI_4, nodes=("node2",))
    [found] = user_calls.images(site, ALICE)["images"]
    assert found["runs_jobs"] is True and found["why_no_jobs"] is None
    assert found["mpi"] == "Open MPI 4.1.4 (/usr/bin/mpirun), mpi4py 3.1.4"
    assert (found["flavour"], found["mpi_version"], found["launcher"]) == \
        ("openmpi4", "4.1.4", "/usr/bin/mpirun")
    assert found["sshd"] == "/usr/sbin/sshd" and found["glibc"] == "2.36"
    assert found["probed_on"] == ["node2"]


def test_a_job_on_an_image_jobs_cannot_run_on_is_refused_with_the_reason(site):
    _probed(site, OPEN_MPI_3)
    with pytest.raises(RequestError, match=r"^image 'mpi' cannot run jobs: it holds Open MPI "
                                           r"3.1.6 \(/opt/ompi3/bin/mpirun\); DockerMPI "
                                           r"launches jobs of Open MPI 4, Open MPI 5, MPICH "
                                           r"\(Hydra\), Intel MPI images$"):
        _submit(site, ALICE)
    assert site.store().jobs(["queued"]) == [] and site.events == []
    [found] = user_calls.images(site, ALICE)["images"]
    assert found["runs_jobs"] is False and "Open MPI 3.1.6" in found["why_no_jobs"]


def test_pillar_says_what_mpi_an_image_holds(site):
    _probed(site, OPEN_MPI_3)
    config = dict(CONFIG, image_facts={"mpi": {"flavour": "openmpi4", "version": "4.1.6",
                                                "launcher": "/opt/ompi/bin/mpirun"}})
    site.settings = site.node_settings = lambda *a, **k: config
    [found] = user_calls.images(site, ALICE)["images"]
    assert found["mpi_from_pillar"] is True and found["runs_jobs"] is True
    assert found["mpi"].startswith("Open MPI 4.1.6 (/opt/ompi/bin/mpirun)")
    job_id = _submit(site, ALICE)["job_id"]
    assert site.store().get(job_id)["spec"]["launch"]["launcher"] == "/opt/ompi/bin/mpirun"


def test_a_job_is_launched_as_the_probe_found_its_image(site):
    _probed(site, dict(OPEN_MPI_4, env_names=["PATH", "VIRTUAL_ENV", "HOME"]))
    job_id = _submit(site, ALICE)["job_id"]
    assert site.store().get(job_id)["spec"]["launch"] == {
        "flavour": "openmpi4", "launcher": "/usr/bin/mpirun",
        "image_env": ["PATH", "VIRTUAL_ENV"]}


MPICH_UCX = dict(OPEN_MPI_4, mpi={"flavour": "mpich", "version": "4.0.2", "device": "ch4:ucx",
                                  "launcher": "/usr/bin/mpirun"})


def test_an_mpich_that_hangs_in_finalize_between_nodes_keeps_its_jobs_to_one_node(site):
    _probed(site, MPICH_UCX)
    [found] = user_calls.images(site, ALICE)["images"]
    assert found["runs_jobs"] is True
    assert found["why_one_node_only"] == (
        "its MPICH 4.0.2 (ch4:ucx) can hang in MPI_Finalize when ranks span nodes (fixed in "
        "MPICH 4.2, pmodels/mpich#6596)")
    with pytest.raises(RequestError, match=r"^image 'mpi' runs jobs on one node only: its "
                                           r"MPICH 4.0.2 \(ch4:ucx\) can hang .*; ask for "
                                           r"nodes=1$"):
        _submit(site, ALICE, nodes=2)
    with pytest.raises(RequestError, match=r"^this job can never run: .*\(each node has 2 "
                                           r"slots\); image 'mpi' runs jobs on one node only"):
        _submit(site, ALICE, np=3)
    assert site.store().jobs(["queued"]) == [] and site.events == []
    job_id = _submit(site, ALICE)["job_id"]
    assert site.store().get(job_id)["spec"]["count"] == 1
    # An admin who knows the site's build is sound says so in pillar.
    config = dict(CONFIG, image_facts={"mpi": {"device": "ch4:ofi"}})
    site.settings = site.node_settings = lambda *a, **k: config
    job_id = _submit(site, ALICE, np=3)["job_id"]
    assert site.store().get(job_id)["spec"]["count"] is None


def test_the_queued_jobs_limit_holds_for_submits_at_the_same_time(site):
    config = dict(CONFIG, limits=dict(CONFIG["limits"], max_queued_jobs_per_user=2))
    site.settings = site.node_settings = lambda *a, **k: config
    for _ in range(2):
        _submit(site, ALICE)
    full = r"^user alice already has 2 jobs queued, the site's limit"
    with pytest.raises(RequestError, match=full):
        _submit(site, ALICE)
    # Another submit read the queue before these were added: the insert counts again.
    store = site.store()
    stale = type(store)(store.path)
    stale.jobs = lambda *a, **k: []
    site.store = lambda: stale
    with pytest.raises(RequestError, match=full):
        _submit(site, ALICE)
    assert len(store.jobs(["queued"], user="alice")) == 2
    assert _submit(site, BOB)["state"] == "queued"


def test_a_job_on_an_image_no_node_probed_yet_is_queued(site):
    assert _submit(site, ALICE)["state"] == "queued"


# ------------------------------------------------------------------ MPI Operator jobs

PI_YAML = (REPO / "tests/unit/dmpi/jobs/data/mpi-operator-pi.yaml").read_text()


def test_an_mpijob_is_queued_as_its_user(site):
    queued = user_calls.submit_mpijob(site, ALICE, mpijob=PI_YAML, image="mpi")
    record = site.store().get(queued["job_id"])
    assert (record["user"], record["np"], record["cmd"], record["name"]) == \
        ("alice", 2, ["/home/mpiuser/pi"], "pi")
    assert record["spec"]["count"] == 2 and record["spec"]["per_node"] == 1


def test_an_mpijob_cannot_name_another_user_and_a_refused_one_queues_nothing(site):
    with pytest.raises(RequestError):
        user_calls.submit_mpijob(site, ALICE, mpijob=PI_YAML, image="mpi", user="bob")
    with pytest.raises(RequestError, match="is no approved image"):
        user_calls.submit_mpijob(site, ALICE, mpijob=PI_YAML)
    assert site.store().jobs(["queued"]) == [] and site.events == []


def test_an_mpijob_runs_only_on_an_image_whose_probed_mpi_is_its_implementation(site):
    intel = (REPO / "tests/unit/dmpi/jobs/data/mpi-operator-pi-intel.yaml").read_text()
    with pytest.raises(RequestError, match="image 'mpi' has not been probed by a node yet"):
        user_calls.submit_mpijob(site, ALICE, mpijob=intel, image="mpi")
    _probed(site, OPEN_MPI_4)
    with pytest.raises(RequestError, match="does not match image 'mpi', whose MPI is Open "
                                           "MPI 4"):
        user_calls.submit_mpijob(site, ALICE, mpijob=intel, image="mpi")
    assert site.store().jobs(["queued"]) == [] and site.events == []
    _probed(site, dict(OPEN_MPI_4, mpi={"flavour": "intelmpi", "version": "2021.18.1",
                                        "launcher": "/opt/venv/bin/mpirun"}))
    queued = user_calls.submit_mpijob(site, ALICE, mpijob=intel, image="mpi")
    record = site.store().get(queued["job_id"])
    assert record["spec"]["launch"]["flavour"] == "intelmpi" and record["np"] == 2
