"""Hub identities as DockerMPI users: name mapping and binding in the store. (What a hub
user may do as one: tests/unit/dmpi/master/test_user_calls.py.)"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dmpi.settings
from dmpi.contract import is_user
from dmpi.errors import RequestError
from dmpi.jobs import store as job_store


@pytest.mark.parametrize("name", ["alice", "Bob", "a-b_c", "x" * 64])
def test_a_valid_user_name_is_its_own_user(name):
    assert dmpi.settings.user_for_identity(name) == name


@pytest.mark.parametrize("name, expected_start", [
    ("Ann.Lee@example.org", "ann-lee-example-org-"),
    ("ÄÖ", "user-"),
    ("-dash", "dash-"),
    ("x" * 65, "x" * 40 + "-"),
    ("../../etc", "etc-"),
])
def test_other_hub_names_get_a_safe_name_with_a_hash(name, expected_start):
    user = dmpi.settings.user_for_identity(name)
    assert user.startswith(expected_start) and is_user(user)
    assert len(user) == len(expected_start) + 8


@settings(deadline=None)  # no timing: other work may share the machine
@given(st.text(min_size=1, max_size=255))
def test_every_hub_name_maps_to_a_valid_user_name(name):
    assert is_user(dmpi.settings.user_for_identity(name))


@pytest.mark.parametrize("bad", ["", None, 5, "x" * 256])
def test_no_identity_is_refused(bad):
    with pytest.raises(RequestError, match="is not a hub user name"):
        dmpi.settings.user_for_identity(bad)


def test_a_user_name_stays_bound_to_the_hub_identity_that_took_it(tmp_path):
    store = job_store.open_store(str(tmp_path / "jobs.sqlite"))
    mapped = dmpi.settings.user_for_identity("Bob.Smith")
    uid, new = store.user_uid(mapped, 100000, 100010, identity="Bob.Smith")
    assert new
    # Someone registers the mapped name itself at the hub: not the same person.
    with pytest.raises(job_store.StoreError, match="belongs to another hub user"):
        store.user_uid(mapped, 100000, 100010, identity=mapped)
    assert store.user_uid(mapped, 100000, 100010, identity="Bob.Smith") == (uid, False)
    assert store.users()[mapped]["identity"] == "Bob.Smith"


def test_an_admin_made_user_is_claimed_once_by_its_hub_user(tmp_path):
    store = job_store.open_store(str(tmp_path / "jobs.sqlite"))
    uid, _ = store.user_uid("carol", 100000, 100010)  # salt-run mpi.add_user carol
    assert store.user_uid("carol", 100000, 100010, identity="carol") == (uid, False)
    assert store.users()["carol"]["identity"] == "carol"
