"""
Unit tests of :mod:`dmpi.seal`: values sealed to one Salt key pair, made by Salt
itself (``salt.crypt.write_keys``), open with that pair's private key only.
"""

import json

import pytest
import salt.crypt

from dmpi import seal



@pytest.fixture
def keys(tmp_path):
    """Two Salt key pairs, as a master and a minion keep theirs."""
    made = {}
    for name in ("minion", "other"):
        folder = tmp_path / name
        folder.mkdir()
        salt.crypt.write_keys(str(folder), name, 2048)
        made[name] = (str(folder / f"{name}.pem"), str(folder / f"{name}.pub"))
    return made


def test_a_sealed_value_opens_with_the_recipients_key_only(keys):
    private, public = keys["minion"]
    secret = json.dumps({"SECRET_TOKEN": "s3cr3t-value"}).encode()
    sealed = seal.seal(public, secret)
    assert seal.is_sealed(sealed)
    assert "s3cr3t" not in json.dumps(sealed)
    assert seal.unseal(private, sealed) == secret
    with pytest.raises(ValueError, match="cannot open"):
        seal.unseal(keys["other"][0], sealed)


def test_each_seal_is_fresh(keys):
    _, public = keys["minion"]
    assert seal.seal(public, b"same")["data"] != seal.seal(public, b"same")["data"]


@pytest.mark.parametrize("change", [
    lambda s: dict(s, data=s["data"][:-4] + ("AAAA" if not s["data"].endswith("AAAA") else "BBBB")),
    lambda s: dict(s, nonce="AAAAAAAAAAAAAAAA"),
    lambda s: dict(s, key="!!"),
    lambda s: {k: v for k, v in s.items() if k != "key"},
    lambda s: dict(s, sealed="plain"),
    lambda s: "text",
])
def test_a_changed_or_forged_value_is_refused(keys, change):
    private, public = keys["minion"]
    with pytest.raises(ValueError):
        seal.unseal(private, change(seal.seal(public, b"output")))


def test_only_bytes_are_sealed(keys):
    with pytest.raises(TypeError):
        seal.seal(keys["minion"][1], "text")


def test_a_replaced_key_file_is_read_again(keys, tmp_path):
    """Keys are loaded once per version of their file (loading an RSA private key costs
    tens of milliseconds); a new key in the same place is the one used."""
    private, public = keys["minion"]
    assert seal.unseal(private, seal.seal(public, b"one")) == b"one"
    other_private, other_public = keys["other"]
    replaced = tmp_path / "replaced"
    replaced.mkdir()
    for source, name in ((other_private, "minion.pem"), (other_public, "minion.pub")):
        (replaced / name).write_bytes(open(source, "rb").read())
        (replaced / name).replace(private if name.endswith(".pem") else public)
    assert seal.unseal(private, seal.seal(public, b"two")) == b"two"
