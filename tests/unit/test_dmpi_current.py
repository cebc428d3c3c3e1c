"""dmpi_current: a process that outlived an upgrade imports the library anew."""

import importlib
import os
import sys
import threading

import dmpi_current
import pytest


@pytest.fixture
def package(tmp_path, monkeypatch):
    """(the folder of a package ``upgraded`` on sys.path, a function writing one of its
    files with a modification time of its own)."""
    root = tmp_path / "upgraded"
    (root / "node").mkdir(parents=True)
    stamps = iter(range(1_800_000_000, 1_900_000_000, 10))

    def write(relative, text):
        path = root / relative
        path.write_text(text)
        moment = next(stamps)
        os.utime(path, (moment, moment))

    write("__init__.py", "")
    write("node/__init__.py", "")
    write("contract.py", "PORT = 22\n")
    write("node/start.py", "from upgraded.contract import PORT\n\nUSES = PORT\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root, write
    for name in [n for n in sys.modules if n == "upgraded" or n.startswith("upgraded.")]:
        del sys.modules[name]
    dmpi_current._IMPORTED.pop("upgraded", None)


def test_a_package_changed_on_disk_is_imported_anew_with_the_names_it_gained(package):
    root, write = package
    assert dmpi_current.ensure("upgraded", str(root)) is False  # the first import
    from upgraded.node import start  # noqa: PLC0415
    assert start.USES == 22
    # An upgrade: the contract gains a name that a changed module imports.
    write("contract.py", "PORT = 2222\nHOST_KEY = 'ed25519'\n")
    write("node/start.py",
          "from upgraded.contract import HOST_KEY, PORT\n\nUSES = PORT, HOST_KEY\n")
    assert dmpi_current.ensure("upgraded", str(root)) is True
    from upgraded.node import start as upgraded_start  # noqa: PLC0415
    assert upgraded_start.USES == (2222, "ed25519") and upgraded_start is not start


def test_a_new_module_of_the_upgrade_is_found(package):
    root, write = package
    dmpi_current.ensure("upgraded", str(root))
    importlib.import_module("upgraded.node")
    write("node/health.py", "OK = True\n")
    assert dmpi_current.ensure("upgraded", str(root)) is True
    from upgraded.node import health  # noqa: PLC0415
    assert health.OK


def test_an_unchanged_package_keeps_its_modules(package):
    root, _ = package
    dmpi_current.ensure("upgraded", str(root))
    from upgraded import contract  # noqa: PLC0415
    for _ in range(3):
        assert dmpi_current.ensure("upgraded", str(root)) is False
    from upgraded import contract as again  # noqa: PLC0415
    assert again is contract


def test_a_package_imported_before_the_first_check_is_kept_as_it_is(package):
    # Code that imported it itself keeps the same classes as the modules imported after.
    root, write = package
    from upgraded import contract  # noqa: PLC0415
    assert dmpi_current.ensure("upgraded", str(root)) is False
    assert sys.modules["upgraded.contract"] is contract
    write("contract.py", "PORT = 2222\n")  # from then on, a change is seen
    assert dmpi_current.ensure("upgraded", str(root)) is True


def test_threads_checking_at_once_import_the_upgrade_once(package):
    root, write = package
    dmpi_current.ensure("upgraded", str(root))
    write("contract.py", "PORT = 2222\n")
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        dmpi_current.ensure("upgraded", str(root)))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False] * 7 + [True]


def test_the_library_beside_it_is_the_one_the_salt_modules_import():
    import dmpi  # noqa: PLC0415

    assert dmpi_current.ensure() is False
    assert os.path.dirname(dmpi.__file__) == os.path.join(
        os.path.dirname(dmpi_current.__file__), "dmpi")
