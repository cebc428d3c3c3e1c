"""
Unit tests for the input checks of ``_runners/mpi.py``: ``_parse_walltime`` and
``_validate_request``, which ``mpi.submit`` and ``mpi.launch`` run before anything else.

Whatever a user passes on the ``salt-run`` command line either comes out normalised or
is refused with a :class:`SaltInvocationError` whose message names the argument at fault
(``mpi.submit`` returns that message as ``error``). Neither function touches Salt's
dunders, so the module is imported as it is.
"""

import pytest
from salt.exceptions import SaltInvocationError

from tests.extension import load_extension

mpi_runner = load_extension("_runners/mpi.py", "mpi_runner")

MAX_WALLTIME = 86400


def _validate(**overrides):
    request = {
        "user": "alice",
        "image": "mpi",
        "np": 4,
        "cmd": "python3 pi.py --digits 10",
        "nodes": None,
        "slots_per_node": None,
        "walltime": None,
        "env": None,
        "workdir": None,
        "max_walltime": MAX_WALLTIME,
    }
    request.update(overrides)
    return mpi_runner._validate_request(**request)


# --------------------------------------------------------------------------- walltime


@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 90),
        (120.0, 120),
        ("90", 90),
        (" 90 ", 90),
        ("45s", 45),
        ("30m", 1800),
        ("2h", 7200),
        ("2H", 7200),
        ("1d", 86400),
        ("05:30", 330),  # MM:SS
        ("01:02:03", 3723),  # HH:MM:SS
        ("1-02", 86400 + 7200),  # D-HH
        ("1-02:03", 86400 + 7200 + 180),  # D-HH:MM
        ("1-02:03:04", 86400 + 7200 + 180 + 4),  # D-HH:MM:SS
        ("0-00:00:01", 1),
    ],
)
def test_parse_walltime_accepts(value, seconds):
    assert mpi_runner._parse_walltime(value) == seconds


@pytest.mark.parametrize(
    "value, message",
    [
        ("abc", "is not a time"),
        ("", "is not a time"),
        ("-5", "is not a time"),
        ("5x", "is not a time"),
        ("1:2:3:4", "is not a time"),
        ("1-", "is not a time"),
        (None, "is not a time"),
        (0, "must be longer than zero"),
        ("0", "must be longer than zero"),
        ("0m", "must be longer than zero"),
        ("00:00", "must be longer than zero"),
        (-5, "must be longer than zero"),
        (True, "is not a whole number of seconds"),
        (False, "is not a whole number of seconds"),
        (1.5, "is not a whole number of seconds"),
    ],
)
def test_parse_walltime_rejects(value, message):
    with pytest.raises(SaltInvocationError, match=f"walltime {value!r}.*{message}"):
        mpi_runner._parse_walltime(value)


# ---------------------------------------------------------------------------- request


def test_valid_request_is_normalised():
    request = _validate(
        cmd="python3 -c 'print(\"hi there\")'", nodes=2, slots_per_node=2, walltime="30m",
        env={"OMP_NUM_THREADS": 2, "NAME": "x y"}, workdir="runs/./one/../two",
    )
    assert request == {
        "user": "alice",
        "image": "mpi",
        "np": 4,
        "program": ["python3", "-c", 'print("hi there")'],
        "nodes": 2,
        "slots_per_node": 2,
        "walltime": 1800,
        "env": {"OMP_NUM_THREADS": "2", "NAME": "x y"},
        "workdir": "/data/runs/two",
    }


def test_defaults_are_one_hour_in_the_data_directory():
    request = _validate()
    assert request["walltime"] == 3600
    assert request["workdir"] == "/data"
    assert request["env"] == {}
    assert request["program"] == ["python3", "pi.py", "--digits", "10"]


def test_cmd_as_list_is_kept_word_for_word():
    assert _validate(cmd=["echo", "a b", "$HOME"])["program"] == ["echo", "a b", "$HOME"]


@pytest.mark.parametrize("workdir, resolved", [
    ("/data", "/data"),
    ("/data/proj", "/data/proj"),
    ("proj/run1", "/data/proj/run1"),
    ("", "/data"),
    ("a/../b", "/data/b"),
])
def test_workdir_resolves_under_data(workdir, resolved):
    assert _validate(workdir=workdir)["workdir"] == resolved


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"user": "al/ice"}, r"user 'al/ice' is not a valid user name"),
        ({"user": ".."}, r"user '\.\.' is not a valid user name"),
        ({"user": "../bob"}, r"user '\.\./bob' is not a valid user name"),
        ({"user": "-alice"}, r"user '-alice' is not a valid user name"),
        ({"user": "a" * 65}, r"is not a valid user name.*at most 64 characters"),
        ({"user": None}, r"user None is not a valid user name"),
        ({"user": ""}, r"user '' is not a valid user name"),
        ({"image": ""}, r"image is required"),
        ({"image": None}, r"image is required"),
        ({"np": 0}, r"np must be a positive whole number of ranks, got 0"),
        ({"np": -1}, r"np must be a positive whole number of ranks, got -1"),
        ({"np": "x"}, r"np must be a positive whole number of ranks, got 'x'"),
        ({"np": True}, r"np must be a positive whole number of ranks, got True"),
        ({"np": 2.0}, r"np must be a positive whole number of ranks, got 2\.0"),
        ({"cmd": ""}, r"cmd is empty"),
        ({"cmd": "   "}, r"cmd is empty"),
        ({"cmd": []}, r"cmd is empty"),
        ({"cmd": [""]}, r"cmd is empty"),
        ({"cmd": "-np 4 ./a.out"}, r"cmd must start with a program, not an option: '-np'"),
        ({"cmd": ["--help"]}, r"cmd must start with a program, not an option"),
        ({"cmd": "echo 'unbalanced"}, r"cmd cannot be split into words"),
        ({"cmd": None}, r"cmd is required"),
        ({"cmd": True}, r"cmd must be the program and its arguments as text or a list, got True"),
        ({"cmd": ["echo", 1]}, r"cmd must be the program and its arguments"),
        ({"cmd": "echo a\0b"}, r"cmd must not contain NUL characters"),
        ({"slots_per_node": 0}, r"slots_per_node must be a positive whole number, got 0"),
        ({"slots_per_node": True}, r"slots_per_node must be a positive whole number, got True"),
        ({"slots_per_node": "2"}, r"slots_per_node must be a positive whole number, got '2'"),
        ({"walltime": "abc"}, r"walltime 'abc' is not a time"),
        ({"walltime": MAX_WALLTIME + 1}, r"walltime 86401 exceeds the site's limit of 86400 seconds"),
        ({"walltime": "2d"}, r"walltime 2d exceeds the site's limit of 86400 seconds"),
        ({"env": ["A=1"]}, r"env must be a mapping"),
        ({"env": {"OMPI_MCA_btl": "self"}}, r"environment variable OMPI_MCA_btl is reserved"),
        ({"env": {"PMIX_RANK": "0"}}, r"environment variable PMIX_RANK is reserved"),
        ({"env": {"HOME": "/tmp"}}, r"environment variable HOME is reserved"),
        ({"env": {"1ABC": "x"}}, r"environment variable name '1ABC' is not valid"),
        ({"env": {"A-B": "x"}}, r"environment variable name 'A-B' is not valid"),
        ({"env": {"A=B": "x"}}, r"environment variable name 'A=B' is not valid"),
        ({"env": {"": "x"}}, r"environment variable name '' is not valid"),
        ({"env": {"CFG": {"a": 1}}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": [1, 2]}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": None}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": "a\0b"}}, r"environment variable CFG needs a plain value"),
        ({"workdir": "../etc"}, r"workdir '\.\./etc' leaves the user's data directory"),
        ({"workdir": "/etc"}, r"workdir '/etc' leaves the user's data directory"),
        ({"workdir": "/data/../etc"}, r"leaves the user's data directory"),
        ({"workdir": "/data2"}, r"workdir '/data2' leaves the user's data directory"),
        ({"workdir": "a/../../.."}, r"leaves the user's data directory"),
        ({"nodes": True}, r"nodes must be a count, a list of nodes or a target expression"),
    ],
)
def test_bad_request_is_refused_naming_the_problem(overrides, message):
    with pytest.raises(SaltInvocationError, match=message):
        _validate(**overrides)


def test_user_of_64_characters_is_accepted():
    assert _validate(user="a" * 64)["user"] == "a" * 64
