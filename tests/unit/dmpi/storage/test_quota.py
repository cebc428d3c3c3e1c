"""Users' quotas from pillar mpi:storage:quota (``dmpi.storage.quota``)."""

import pytest
from dmpi.storage import quota

QUOTA = {"size_mb": 2048, "files": 100000,
         "users": {"filler": {"size_mb": 48}, "archivist": {"files": 0}}}


def test_a_user_gets_the_sites_limits_unless_named_and_then_only_what_is_named():
    assert quota.limits(QUOTA, "alice") == (2048, 100000)
    assert quota.limits(QUOTA, "filler") == (48, 100000)
    assert quota.limits(QUOTA, "archivist") == (2048, 0)
    assert quota.limits({"size_mb": 0, "files": 0}, "alice") == (0, 0)


def test_the_users_path_inside_the_volume_takes_only_user_names():
    assert quota.user_path("alice") == "/users/alice"
    for bad in ("../etc", "a/b", "", ".hidden", "x" * 65):
        with pytest.raises(ValueError, match="not a DockerMPI user name"):
            quota.user_path(bad)


def test_figures_by_user_keep_user_directories_only():
    figures = {"bytes_used": 1, "bytes_limit": 2, "files_used": 3, "files_limit": 4}
    found = {"/users/bob": figures, "/users/alice/": figures, "/users": figures,
             "/": figures, "/users/alice/mpi-jobs": figures, "/other/carol": figures}
    assert quota.by_user(found) == {"alice": figures, "bob": figures}
