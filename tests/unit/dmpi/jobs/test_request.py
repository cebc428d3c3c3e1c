"""
Unit tests for ``dmpi.jobs.request``: the checks ``mpi.submit`` and ``mpi.launch``
run on a job request before anything else.

Whatever a user passes on the ``salt-run`` command line or through the API either comes
out normalised or is refused with a :class:`RequestError` whose one-line message names
the argument at fault (``mpi.submit`` returns that message as ``error``). The property
tests at the end throw arbitrary values at every argument and hold the module to that
contract: no other exception, no traceback, no megabytes of input echoed back.
"""

import math
import posixpath
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dmpi.jobs import request as job_request

RequestError = job_request.RequestError

MAX_WALLTIME = 86400
LIMITS = {"max_walltime": MAX_WALLTIME}
TEN_YEARS = 3650 * 86400


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
        "limits": LIMITS,
    }
    request.update(overrides)
    return job_request.validate_request(**request)


def _short_id(value):
    """A readable test id for values too long (or too large) for pytest's own."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**20:
        return "huge-int"
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:10]!r}...({len(value)}-chars)"
    if isinstance(value, list) and len(value) > 10:
        return f"list-of-{len(value)}"
    return None


def _assert_clean_refusal(exc):
    """A refusal a user can read: one short line that survives UTF-8 output."""
    message = str(exc)
    assert type(exc) is RequestError
    assert message
    assert len(message.splitlines()) == 1, message
    assert len(message) <= 300, message
    message.encode("utf-8")


def test_request_error_is_a_value_error():
    assert issubclass(RequestError, ValueError)


# --------------------------------------------------------------------------- walltime


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("90s", 90),
        (" 90s ", 90),
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
        ("000000000000000090s", 90),
        (f"{TEN_YEARS}s", TEN_YEARS),
        ("3650d", TEN_YEARS),
    ],
    ids=_short_id,
)
def test_parse_walltime_accepts(value, seconds):
    assert job_request.parse_walltime(value) == seconds


@pytest.mark.parametrize(
    "value, message",
    [
        ("abc", "is not a time"),
        ("", "is not a time"),
        ("-5", "is not a time"),
        ("5x", "is not a time"),
        ("1:2:3:4", "is not a time"),
        ("1-", "is not a time"),
        ("1_000", "is not a time"),
        ("90\n5", "is not a time"),
        (None, "is not a time"),
        (b"90", "is not a time"),
        ([90], "is not a time"),
        ({"h": 2}, "is not a time"),
        ("0m", "must be longer than zero"),
        ("00:00", "must be longer than zero"),
        (True, "is not a time"),
        (False, "is not a time"),
        ("3651d", "is longer than ten years"),
        ("9999999999999999999s", "is longer than ten years"),
        # A bare number: seconds to some, Slurm's minutes to others.
        (0, "has no unit"),
        ("0", "has no unit"),
        (90, "has no unit"),
        ("90", "has no unit"),
        (" 90 ", "has no unit"),
        (-5, "has no unit"),
        (-0.0, "has no unit"),
        (1.5, "has no unit"),
        (math.inf, "has no unit"),
        (math.nan, "has no unit"),
        (TEN_YEARS + 1, "has no unit"),
        (1e300, "has no unit"),
        ("99999999999999999999", "has no unit"),
    ],
    ids=_short_id,
)
def test_parse_walltime_rejects(value, message):
    with pytest.raises(RequestError, match=f"^walltime .*{message}") as caught:
        job_request.parse_walltime(value)
    _assert_clean_refusal(caught.value)


@pytest.mark.parametrize(
    "value",
    [
        "٣",  # ARABIC-INDIC DIGIT THREE: str.isdigit() accepts it, so int() did too
        "²",  # SUPERSCRIPT TWO: str.isdigit() accepts it, int() refuses it
        "²m",
        "１２",  # FULLWIDTH digits
        "٣:٠٠",
        "1-٢",
        "3\u0663",
    ],
)
def test_parse_walltime_takes_only_ascii_digits(value):
    with pytest.raises(RequestError, match="is not a time") as caught:
        job_request.parse_walltime(value)
    _assert_clean_refusal(caught.value)


@pytest.mark.parametrize(
    "value",
    ["9" * 5000 + "s", "1" * 21 + "m", "1-" + "0" * 5000, " " * 10 + "9" * 30 + "h"],
    ids=_short_id,
)
def test_parse_walltime_refuses_long_text_without_converting_it(value):
    with pytest.raises(RequestError, match=r"at most 20 characters") as caught:
        job_request.parse_walltime(value)
    _assert_clean_refusal(caught.value)


def test_parse_walltime_refuses_huge_numbers_without_printing_them():
    with pytest.raises(RequestError, match="walltime <a number of over 40 digits> has") as caught:
        job_request.parse_walltime(10**5000)
    _assert_clean_refusal(caught.value)


# ----------------------------------------------------------------------------- nodes


@pytest.mark.parametrize(
    "nodes, parsed",
    [
        (None, None),
        ("", None),
        ("  ", None),
        (2, {"count": 2}),
        ("2", {"count": 2}),
        (" 3 ", {"count": 3}),
        (1000, {"count": 1000}),
        (["node1", "node2"], {"list": ["node1", "node2"]}),
        (("node1",), {"list": ["node1"]}),
        ("node1,node2", {"list": ["node1", "node2"]}),
        ("node1, node2", {"list": ["node1", "node2"]}),
        ("node1", {"list": ["node1"]}),
        ("n.example-1_a", {"list": ["n.example-1_a"]}),
        ("G@rack:a", {"grain": "rack:a"}),
        ("G@hw:gpu:yes", {"grain": "hw:gpu:yes"}),
        ("G@roles:mpi-node", {"grain": "roles:mpi-node"}),
        ("G@rack:a*", {"grain": "rack:a*"}),
    ],
    ids=_short_id,
)
def test_parse_nodes_accepts(nodes, parsed):
    assert job_request.parse_nodes(nodes) == parsed


@pytest.mark.parametrize(
    "nodes, message",
    [
        (True, r"nodes=True is not accepted: nodes= takes a count, a node list or one grain"),
        (False, r"nodes=False is not accepted"),
        (0, r"nodes=0: need at least one node"),
        (-2, r"nodes=-2: need at least one node"),
        ("0", r"nodes='0': need at least one node"),
        (1001, r"more than the 1000 nodes a job may use"),
        ("9" * 5000, r"more than the 1000 nodes a job may use"),
        (10**5000, r"nodes=<a number of over 40 digits> is more than the 1000 nodes"),
        (2.0, r"is not accepted"),
        ({"node1": 1}, r"is not accepted"),
        ("I@mpi:slots_per_node:2", r"never pillar or other targets"),
        ("P@os:Linux", r"never pillar or other targets"),
        ("E@node[12]", r"never pillar or other targets"),
        ("L@node1,node2", r"never pillar or other targets"),
        ("S@10.0.0.0/24", r"never pillar or other targets"),
        ("J@roles:^mpi", r"never pillar or other targets"),
        ("G@rack:a and G@rack:b", r"never pillar or other targets"),
        ("G@rack:a or I@x:y", r"never pillar or other targets"),
        ("not G@rack:a", r"never pillar or other targets"),
        ("( G@rack:a )", r"never pillar or other targets"),
        ("G@rack", r"never pillar or other targets"),
        ("G@rack:", r"never pillar or other targets"),
        ("G@rack:a b", r"never pillar or other targets"),
        ("G@r*ck:a", r"never pillar or other targets"),
        ("node*", r"never pillar or other targets"),
        ("node1,,node2", r"never pillar or other targets"),
        ("node1,", r"never pillar or other targets"),
        ("nöde1", r"never pillar or other targets"),
        ("node1\0", r"never pillar or other targets"),
        ("G@rack:" + "a" * 300, r"never pillar or other targets"),
        ([], r"nodes is an empty list"),
        (["node1", "node2", "node1"], r"nodes lists node1 twice"),
        ("node1,node2,node1", r"nodes lists node1 twice"),
        (["node1", 2], r"nodes lists 2, which is not a node id"),
        (["node 1"], r"nodes lists 'node 1', which is not a node id"),
        (["a" * 65], r"which is not a node id"),
        ([["node1"]], r"nodes lists \['node1'\], which is not a node id"),
        ([f"n{i}" for i in range(1001)], r"nodes lists 1001 nodes, more than the 1000"),
    ],
    ids=_short_id,
)
def test_parse_nodes_rejects(nodes, message):
    with pytest.raises(RequestError, match=message) as caught:
        job_request.parse_nodes(nodes)
    _assert_clean_refusal(caught.value)


# ---------------------------------------------------------------------------- request


def test_valid_request_is_normalised():
    request = _validate(
        cmd="python3 -c 'print(\"hi there\")'", nodes=2, slots_per_node=2, walltime="30m",
        env={"OMP_NUM_THREADS": 2, "NAME": "x y", "SCALE": 0.5}, workdir="runs/./one/../two",
    )
    assert request == {
        "user": "alice",
        "image": "mpi",
        "np": 4,
        "program": ["python3", "-c", 'print("hi there")'],
        "nodes": {"count": 2},
        "slots_per_node": 2,
        "walltime": 1800,
        "env": {"OMP_NUM_THREADS": "2", "NAME": "x y", "SCALE": "0.5"},
        "workdir": "/data/runs/two",
    }


def test_defaults_are_one_hour_in_the_data_directory():
    request = _validate()
    assert request["walltime"] == 3600
    assert request["workdir"] == "/data"
    assert request["env"] == {}
    assert request["nodes"] is None
    assert request["program"] == ["python3", "pi.py", "--digits", "10"]


def test_default_walltime_stays_within_a_shorter_site_limit():
    assert _validate(limits={"max_walltime": 600})["walltime"] == 600


def test_limits_default_when_not_given():
    request = _validate(limits=None, walltime="1d", np=4096)
    assert (request["walltime"], request["np"]) == (86400, 4096)


def test_limits_ignore_other_site_settings():
    limits = {"max_walltime": 60, "max_running_jobs_per_user": 2, "max_slots_per_user": None}
    assert _validate(limits=limits, walltime="60s")["walltime"] == 60


@pytest.mark.parametrize("limits", [{"max_np": 0}, {"max_np": True}, {"max_walltime": "x"}, [1]])
def test_bad_site_limits_are_named(limits):
    with pytest.raises(RequestError, match="limit") as caught:
        _validate(limits=limits)
    _assert_clean_refusal(caught.value)


def test_np_as_ascii_digits_is_a_number():
    assert _validate(np="6")["np"] == 6


def test_cmd_as_list_is_kept_word_for_word():
    assert _validate(cmd=["echo", "a b", "$HOME"])["program"] == ["echo", "a b", "$HOME"]
    assert _validate(cmd=("echo", "", "x"))["program"] == ["echo", "", "x"]


def test_cmd_of_non_ascii_text_is_kept():
    assert _validate(cmd="echo 'grüße ✓'")["program"] == ["echo", "grüße ✓"]


@pytest.mark.parametrize("workdir, resolved", [
    ("/data", "/data"),
    ("/data/proj", "/data/proj"),
    ("proj/run1", "/data/proj/run1"),
    ("", "/data"),
    ("a/../b", "/data/b"),
    ("./a//b/", "/data/a/b"),
    ("résultats", "/data/résultats"),
    ("a" * 255, "/data/" + "a" * 255),
])
def test_workdir_resolves_under_data(workdir, resolved):
    assert _validate(workdir=workdir)["workdir"] == resolved


def test_request_within_every_limit_is_accepted():
    limits = dict(LIMITS, max_cmd_words=3, max_cmd_bytes=12, max_env_vars=2, max_env_bytes=4)
    request = _validate(cmd=["abcd", "efgh", "ijkl"], env={"A": "1", "B": 2}, limits=limits)
    assert request["program"] == ["abcd", "efgh", "ijkl"]
    assert request["env"] == {"A": "1", "B": "2"}


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
        ({"user": "alice\n"}, r"user 'alice\\n' is not a valid user name"),
        ({"user": "ålice"}, r"user 'ålice' is not a valid user name"),
        ({"user": ["alice"]}, r"user \['alice'\] is not a valid user name"),
        ({"image": ""}, r"image is required"),
        ({"image": None}, r"image is required"),
        ({"image": "reg/mpi"}, r"image 'reg/mpi' is not an image name"),
        ({"image": "a" * 129}, r"is not an image name.*at most 128 characters"),
        ({"image": 5}, r"image 5 is not an image name"),
        ({"np": 0}, r"np must be a positive whole number of ranks, got 0"),
        ({"np": -1}, r"np must be a positive whole number of ranks, got -1"),
        ({"np": "x"}, r"np must be a positive whole number of ranks, got 'x'"),
        ({"np": True}, r"np must be a positive whole number of ranks, got True"),
        ({"np": 2.0}, r"np must be a positive whole number of ranks, got 2\.0"),
        ({"np": None}, r"np must be a positive whole number of ranks, got None"),
        ({"np": "٤"}, r"np must be a positive whole number of ranks, got '٤'"),
        ({"np": "-4"}, r"np must be a positive whole number of ranks"),
        ({"np": 4097}, r"np=4097 exceeds the site's limit of 4096 ranks \(mpi:limits:max_np\)"),
        ({"np": "9" * 5000}, r"np='9{50}.*exceeds the site's limit of 4096 ranks"),
        ({"np": 10**5000}, r"np=<a number of over 40 digits> exceeds the site's limit"),
        ({"cmd": ""}, r"cmd is empty"),
        ({"cmd": "   "}, r"cmd is empty"),
        ({"cmd": []}, r"cmd is empty"),
        ({"cmd": [""]}, r"cmd is empty"),
        ({"cmd": "'' x"}, r"cmd is empty"),
        ({"cmd": "-np 4 ./a.out"}, r"cmd must start with a program, not an option: '-np'"),
        ({"cmd": ["--help"]}, r"cmd must start with a program, not an option"),
        ({"cmd": "echo 'unbalanced"}, r"cmd cannot be split into words: No closing quotation"),
        ({"cmd": "echo \\"}, r"cmd cannot be split into words"),
        ({"cmd": None}, r"cmd is required"),
        ({"cmd": True}, r"cmd must be the program and its arguments as text or a list, got True"),
        ({"cmd": {"a": 1}}, r"cmd must be the program and its arguments as text or a list"),
        ({"cmd": ["echo", 1]}, r"cmd must be the program and its arguments.*word 2 is 1"),
        ({"cmd": ["sleep", None]}, r"word 2 is None"),
        ({"cmd": "echo a\0b"}, r"cmd must not contain NUL characters"),
        ({"cmd": ["echo", "a\0b"]}, r"cmd must not contain NUL characters"),
        ({"cmd": "echo \udcff"}, r"cmd must be valid UTF-8 text"),
        ({"cmd": ["echo", "\ud800"]}, r"cmd word 2 is not valid UTF-8 text"),
        ({"cmd": "x" * 70000}, r"over the site's limit of 65536 bytes \(mpi:limits:max_cmd_bytes\)"),
        ({"cmd": ["echo", "é" * 40000]},
         r"cmd is over the site's limit of 65536 bytes \(mpi:limits:max_cmd_bytes\)"),
        ({"cmd": ["echo"] * 5000},
         r"cmd has 5000 words, over the site's limit of 4096 \(mpi:limits:max_cmd_words\)"),
        ({"cmd": "echo " + "x " * 5000}, r"cmd has 5001 words, over the site's limit of 4096"),
        ({"slots_per_node": 0}, r"slots_per_node must be a positive whole number, got 0"),
        ({"slots_per_node": True}, r"slots_per_node must be a positive whole number, got True"),
        ({"slots_per_node": "2"}, r"slots_per_node must be a positive whole number, got '2'"),
        ({"slots_per_node": 10**5000}, r"slots_per_node=<a number of over 40 digits> exceeds"),
        ({"walltime": "abc"}, r"walltime 'abc' is not a time"),
        ({"walltime": f"{MAX_WALLTIME + 1}s"},
         r"walltime '86401s' exceeds the site's limit of 86400 seconds \(mpi:limits:max_walltime\)"),
        ({"walltime": "2d"}, r"walltime '2d' exceeds the site's limit of 86400 seconds"),
        ({"walltime": "٣"}, r"walltime '٣' is not a time"),
        ({"walltime": "9" * 5000 + "m"}, r"walltime '9{50}.* is not a time: at most 20 characters"),
        ({"walltime": 10**5000}, r"walltime <a number of over 40 digits> has no unit"),
        ({"env": ["A=1"]}, r"env must be a mapping of variable names to values, got \['A=1'\]"),
        ({"env": "A=1"}, r"env must be a mapping"),
        ({"env": {"OMPI_MCA_btl": "self"}}, r"environment variable OMPI_MCA_btl is reserved"),
        ({"env": {"PMIX_RANK": "0"}}, r"environment variable PMIX_RANK is reserved"),
        ({"env": {"OPAL_PREFIX": "/x"}}, r"environment variable OPAL_PREFIX is reserved"),
        ({"env": {"ORTE_X": "1"}}, r"environment variable ORTE_X is reserved"),
        ({"env": {"DMPI_JOB_ID": "x"}}, r"environment variable DMPI_JOB_ID is reserved"),
        ({"env": {"HOME": "/tmp"}}, r"environment variable HOME is reserved"),
        ({"env": {"1ABC": "x"}}, r"environment variable name '1ABC' is not valid"),
        ({"env": {"A-B": "x"}}, r"environment variable name 'A-B' is not valid"),
        ({"env": {"A=B": "x"}}, r"environment variable name 'A=B' is not valid"),
        ({"env": {"": "x"}}, r"environment variable name '' is not valid"),
        ({"env": {"A\n": "x"}}, r"environment variable name 'A\\n' is not valid"),
        ({"env": {"ÄB": "x"}}, r"environment variable name 'ÄB' is not valid"),
        ({"env": {1: "x"}}, r"environment variable name 1 is not valid"),
        ({"env": {"A" * 129: "x"}}, r"environment variable name 'A+\.\.\. is not valid"),
        ({"env": {"CFG": {"a": 1}}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": [1, 2]}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": None}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": True}},
         r"environment variable CFG needs a plain value \(text or a number\), got True"),
        ({"env": {"CFG": math.nan}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": 10**5000}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": b"x"}}, r"environment variable CFG needs a plain value"),
        ({"env": {"CFG": "a\0b"}}, r"environment variable CFG needs a plain value without NUL"),
        ({"env": {"CFG": "\udcff"}}, r"variable CFG needs a plain value of valid UTF-8"),
        ({"env": {f"V{i}": "x" for i in range(300)}},
         r"env has 300 variables, over the site's limit of 256 \(mpi:limits:max_env_vars\)"),
        ({"env": {"BIG": "x" * 70000}},
         r"env is over the site's limit of 65536 bytes.*\(mpi:limits:max_env_bytes\)"),
        ({"env": {f"V{i}": "é" * 200 for i in range(200)}}, r"\(mpi:limits:max_env_bytes\)"),
        ({"workdir": "../etc"}, r"workdir '\.\./etc' leaves the user's data directory"),
        ({"workdir": "/etc"}, r"workdir '/etc' leaves the user's data directory"),
        ({"workdir": "/data/../etc"}, r"leaves the user's data directory"),
        ({"workdir": "/data2"}, r"workdir '/data2' leaves the user's data directory"),
        ({"workdir": "a/../../.."}, r"leaves the user's data directory"),
        ({"workdir": "//data/x"}, r"leaves the user's data directory"),
        ({"workdir": "a\nb"}, r"workdir 'a\\nb' must not contain NUL, newlines"),
        ({"workdir": "a\0b"}, r"must not contain NUL, newlines"),
        ({"workdir": "\udcff"}, r"workdir must be valid UTF-8 text"),
        ({"workdir": "a/" * 3000}, r"workdir is longer than 4096 bytes"),
        ({"workdir": "é" * 2100}, r"workdir is longer than 4096 bytes"),
        ({"workdir": "a" * 256}, r"has a component longer than 255 bytes"),
        ({"workdir": "é" * 128}, r"has a component longer than 255 bytes"),
        ({"workdir": 2024}, r"workdir must be a path as text, got 2024"),
        ({"workdir": ["a"]}, r"workdir must be a path as text"),
        ({"nodes": True}, r"nodes=True is not accepted: nodes= takes a count, a node list"),
        ({"nodes": "I@mpi:slots_per_node:2"}, r"never pillar or other targets"),
        ({"nodes": ["n1", "n1"]}, r"nodes lists n1 twice"),
    ],
    ids=_short_id,
)
def test_bad_request_is_refused_naming_the_problem(overrides, message):
    with pytest.raises(RequestError, match=message) as caught:
        _validate(**overrides)
    _assert_clean_refusal(caught.value)


def test_user_of_64_characters_is_accepted():
    assert _validate(user="a" * 64)["user"] == "a" * 64


@pytest.mark.parametrize(
    "user, valid",
    [
        ("alice", True),
        ("a" * 64, True),
        ("b0b_x-1", True),
        ("a" * 65, False),
        ("alice\n", False),
        ("ålice", False),
        ("-alice", False),
        ("", False),
        (None, False),
        (["alice"], False),
        (10**5000, False),
    ],
    ids=_short_id,
)
def test_valid_user(user, valid):
    assert job_request.valid_user(user) is valid


def test_refusal_quotes_at_most_60_characters_of_the_value():
    with pytest.raises(RequestError) as caught:
        _validate(user="x" * 1_000_000)
    assert "x" * 61 not in str(caught.value)
    _assert_clean_refusal(caught.value)


def test_deeply_nested_values_are_refused_cleanly():
    nested = []
    for _ in range(10_000):
        nested = [nested]
    looped = []
    looped.append(looped)
    for value in (nested, looped):
        with pytest.raises(RequestError) as caught:
            _validate(env=value)
        _assert_clean_refusal(caught.value)
        with pytest.raises(RequestError) as caught:
            _validate(nodes=[value])
        _assert_clean_refusal(caught.value)


# ------------------------------------------------------------------------- properties

PROPERTY_SETTINGS = settings(
    max_examples=300, deadline=None, database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Any character at all, lone surrogates included: Salt decodes undecodable argv bytes
# into them.
any_char = st.characters(exclude_categories=[])
any_text = st.text(any_char, max_size=40)
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | any_text | st.binary(max_size=20)
    | st.sampled_from(["\0", "\udcff", "٣", "²"])
    # Built on demand: hypothesis prints its strategies, and Python refuses to print ints
    # of over 4300 digits.
    | st.sampled_from([1, -1]).map(lambda sign: sign * 10**5000)
    | st.sampled_from(["9", "x"]).map(lambda char: char * 100_000)
)
anything = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(any_text | st.integers(), children, max_size=4),
    max_leaves=12,
)
# Digits of other scripts, which str.isdigit() accepts.
digits = st.sampled_from(string.digits) | st.characters(categories=["Nd", "No"])
valid_numbers = st.integers(1, 64) | st.integers(1, 64).map(str)
near_numbers = valid_numbers | st.text(digits, min_size=1, max_size=25) | st.integers(-5, 5000)
near_walltimes = (
    st.from_regex(r"\A ?[0-9]{1,22}[smhdSMHDx]? ?\Z")
    | st.from_regex(r"\A([0-9]{1,6}-)?[0-9]{1,4}(:[0-9]{1,4}){0,3}\Z")
    | st.text(st.sampled_from("0123456789:-smhd ٣²") | digits, max_size=24)
    | st.floats(allow_nan=True, allow_infinity=True)
)
node_id = st.from_regex(r"\A[A-Za-z0-9_.*@ -]{0,66}\Z")
near_nodes = (
    st.from_regex(r"\A[GIPELSJN]@[A-Za-z0-9_.:*@ -]{0,24}\Z")
    | st.from_regex(r"\A(G@[a-z]{1,5}(:[a-z*]{1,5}){1,3}( (and|or|not) )?){1,3}\Z")
    | st.lists(node_id, max_size=6).map(",".join)
    | st.lists(st.sampled_from(["n1", "n2", "n3", "n 4", "n*"]), max_size=6)
    | st.lists(node_id, max_size=6)
    | near_numbers
)
near_users = st.from_regex(r"\A[A-Za-z0-9_./\n-]{0,70}\Z")
near_images = st.from_regex(r"\A[A-Za-z0-9_./:@-]{0,130}\Z")
near_cmds = (
    st.text(st.sampled_from("ab -'\"\\\0\n\t") | any_char, max_size=40)
    | st.lists(st.text(st.sampled_from("ab-\0") | any_char, max_size=8), max_size=6)
)
env_names = (
    st.from_regex(r"\A[A-Z_][A-Z0-9_]{0,8}\Z")
    | st.from_regex(r"\A[A-Za-z0-9_=\n-]{0,10}\Z")
    | st.sampled_from(["HOME", "OMPI_X", "PMIX_RANK", "OPAL_A", "ORTE_B", "DMPI_JOB", "PATH",
                       "A" * 129])
)
env_values = st.text(any_char, max_size=20) | st.integers() | st.floats() | anything
near_envs = st.dictionaries(env_names, env_values, max_size=4)
path_parts = st.sampled_from(["", "a", "..", ".", "data", "/data", "a\0", "\n", "é", "a" * 256])
near_workdirs = (
    st.lists(path_parts | st.text(any_char, max_size=4), max_size=8).map("/".join)
    | st.sampled_from(["a/" * 3000, "é" * 2100])
)

SMALL_LIMITS = {"max_walltime": 7200, "max_np": 64, "max_cmd_bytes": 64, "max_cmd_words": 8,
                "max_env_bytes": 64, "max_env_vars": 3}
limits_choice = st.sampled_from([None, LIMITS, SMALL_LIMITS])


def _check_request(request, limits):
    """The invariants of an accepted request, under the limits it was checked against."""
    limits = dict(job_request.DEFAULT_LIMITS, **(limits or {}))
    assert set(request) == {"user", "image", "np", "program", "nodes", "slots_per_node",
                            "walltime", "env", "workdir"}
    assert isinstance(request["user"], str) and job_request.USER_RE.match(request["user"])
    assert isinstance(request["image"], str) and 0 < len(request["image"]) <= 128
    assert type(request["np"]) is int and 1 <= request["np"] <= limits["max_np"]
    program = request["program"]
    assert isinstance(program, list) and program and program[0]
    assert not program[0].startswith("-")
    assert len(program) <= limits["max_cmd_words"]
    assert all(type(word) is str and "\0" not in word for word in program)
    assert sum(len(word.encode("utf-8")) for word in program) <= limits["max_cmd_bytes"]
    _check_nodes(request["nodes"])
    per_node = request["slots_per_node"]
    assert per_node is None or type(per_node) is int and 1 <= per_node <= limits["max_np"]
    walltime = request["walltime"]
    assert type(walltime) is int and 1 <= walltime <= limits["max_walltime"]
    env = request["env"]
    assert isinstance(env, dict) and len(env) <= limits["max_env_vars"]
    size = 0
    for name, value in env.items():
        assert type(name) is str and type(value) is str
        assert name.isascii() and (name[0].isalpha() or name[0] == "_")
        assert all(c.isalnum() or c == "_" for c in name) and len(name) <= 128
        assert name not in job_request.RESERVED_ENV_NAMES
        assert not name.startswith(job_request.RESERVED_ENV_PREFIXES)
        assert "\0" not in value
        size += len(name) + len(value.encode("utf-8"))
    assert size <= limits["max_env_bytes"]
    workdir = request["workdir"]
    assert workdir == posixpath.normpath(workdir)
    assert workdir == "/data" or workdir.startswith("/data/")
    assert len(workdir.encode("utf-8")) <= 4096
    assert all(ord(c) >= 0x20 and c != "\x7f" for c in workdir)


def _check_nodes(nodes):
    if nodes is None:
        return
    assert isinstance(nodes, dict) and len(nodes) == 1
    if "count" in nodes:
        assert type(nodes["count"]) is int and 1 <= nodes["count"] <= 1000
    elif "list" in nodes:
        ids = nodes["list"]
        assert isinstance(ids, list) and 1 <= len(ids) <= 1000 and len(set(ids)) == len(ids)
        for node in ids:
            assert type(node) is str and 1 <= len(node) <= 64 and node.isascii()
            assert all(c.isalnum() or c in "_.-" for c in node)
    else:
        grain = nodes["grain"]
        assert type(grain) is str and ":" in grain and grain.isascii()
        assert all(c.isalnum() or c in "_.-:*" for c in grain)
        assert not grain.startswith(":") and not grain.endswith(":")


@PROPERTY_SETTINGS
@given(
    user=anything | near_users,
    image=anything | near_images,
    np=anything | near_numbers,
    cmd=anything | near_cmds,
    nodes=anything | near_nodes,
    slots_per_node=anything | near_numbers,
    walltime=anything | near_walltimes,
    env=anything | near_envs,
    workdir=anything | near_workdirs,
    limits=limits_choice,
)
def test_any_request_is_normalised_or_refused_cleanly(user, image, np, cmd, nodes,
                                                      slots_per_node, walltime, env, workdir,
                                                      limits):
    try:
        request = job_request.validate_request(user, image, np, cmd, nodes, slots_per_node,
                                               walltime, env, workdir, limits)
    except RequestError as exc:
        _assert_clean_refusal(exc)
    else:
        _check_request(request, limits)


NEAR_VALID = {
    "user": near_users,
    "image": near_images,
    "np": near_numbers,
    "cmd": near_cmds,
    "nodes": near_nodes,
    "slots_per_node": st.none() | near_numbers,
    "walltime": st.none() | near_walltimes,
    "env": st.none() | near_envs,
    "workdir": st.none() | near_workdirs,
}


@PROPERTY_SETTINGS
@given(
    overrides=st.dictionaries(st.sampled_from(sorted(NEAR_VALID)), st.none(), min_size=1,
                              max_size=3).flatmap(
        lambda names: st.fixed_dictionaries({name: NEAR_VALID[name] for name in names})
    ),
    limits=limits_choice,
)
def test_near_valid_requests_are_normalised_or_refused_cleanly(overrides, limits):
    # A few near-valid arguments among valid ones, so that every check is reached and
    # both outcomes are common (arbitrary values are almost always refused by the first).
    try:
        request = _validate(**dict(overrides, limits=limits))
    except RequestError as exc:
        _assert_clean_refusal(exc)
    else:
        _check_request(request, limits)


@PROPERTY_SETTINGS
@given(limits=anything | st.dictionaries(st.sampled_from(sorted(job_request.DEFAULT_LIMITS)),
                                         anything | near_numbers, max_size=6))
def test_any_limits_are_used_or_refused_cleanly(limits):
    try:
        _validate(limits=limits)
    except RequestError as exc:
        _assert_clean_refusal(exc)


@PROPERTY_SETTINGS
@given(user=anything | near_users)
def test_valid_user_answers_for_anything(user):
    assert job_request.valid_user(user) is (
        isinstance(user, str) and job_request.USER_RE.match(user) is not None
    )
    if job_request.valid_user(user):
        assert user.isascii() and "\n" not in user and 1 <= len(user) <= 64


@PROPERTY_SETTINGS
@given(value=anything | near_walltimes)
def test_any_walltime_is_seconds_or_refused_cleanly(value):
    try:
        seconds = job_request.parse_walltime(value)
    except RequestError as exc:
        _assert_clean_refusal(exc)
    else:
        assert type(seconds) is int and 1 <= seconds <= TEN_YEARS


@PROPERTY_SETTINGS
@given(value=anything | near_nodes)
def test_any_nodes_are_parsed_or_refused_cleanly(value):
    try:
        nodes = job_request.parse_nodes(value)
    except RequestError as exc:
        _assert_clean_refusal(exc)
    else:
        _check_nodes(nodes)


@PROPERTY_SETTINGS
@given(
    days=st.none() | st.integers(0, 99),
    clock=st.lists(st.integers(0, 99), min_size=1, max_size=3),
)
def test_slurm_walltimes_add_up(days, clock):
    if days is None and len(clock) == 1:
        clock = [0] + clock  # a lone number is seconds, not a clock
    text = ":".join(f"{part:02d}" for part in clock)
    if days is not None:
        text = f"{days}-{text}"
        hours, minutes, seconds = clock + [0] * (3 - len(clock))
    else:
        hours, minutes, seconds = [0] * (3 - len(clock)) + clock
    expected = (days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds
    if expected == 0:
        with pytest.raises(RequestError, match="must be longer than zero"):
            job_request.parse_walltime(text)
    else:
        assert job_request.parse_walltime(text) == expected
