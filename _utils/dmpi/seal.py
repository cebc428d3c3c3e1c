"""
Seal data for one Salt host's eyes: what users put in their jobs (environment values)
and what their jobs print travels between the master and a node in a Salt publish or
return, and Salt keeps both in the master's job cache and fires them on its event bus.
Sealed, both hold only ciphertext.

A sealed value is encrypted with a fresh AES-256-GCM key, and that key with the
recipient's Salt RSA key (OAEP, SHA-256): the master seals to a minion's accepted key
(``<pki_dir>/minions/<id>``), a minion to the master's (``<pki_dir>/minion_master.pub``).
Only the recipient's private key (``master.pem``, ``minion.pem``) opens it. Salt's own
keys are used, so nothing new is distributed.

:depends: cryptography
"""

import base64
import functools
import os

SCHEME = "rsa-oaep-sha256+aes-256-gcm"


def _oaep():
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    return padding.OAEP(mgf=padding.MGF1(algorithm=hashes.SHA256()),
                        algorithm=hashes.SHA256(), label=None)


def _load(path, private):
    """The key in ``path``, loaded once per version of the file (the master opens output
    many times a second)."""
    info = os.stat(path)
    return _load_version(path, private, info.st_mtime_ns, info.st_size, info.st_ino)


@functools.lru_cache(maxsize=64)
def _load_version(path, private, *version):
    from cryptography.hazmat.primitives import serialization

    with open(path, "rb") as handle:
        data = handle.read()
    if private:
        # Salt's own key, which only root writes: checking its primes guards against
        # crafted keys and costs some 40 ms, paid again by every process that loads it.
        return serialization.load_pem_private_key(data, password=None,
                                                  unsafe_skip_rsa_key_validation=True)
    return serialization.load_pem_public_key(data)


def seal(public_key_path, data):
    """
    Seal ``data`` (bytes) to the RSA public key in ``public_key_path`` (PEM, as Salt keeps
    it). Returns ``{"sealed": SCHEME, "key": ..., "nonce": ..., "data": ...}``, base64
    text a publish or return carries as it is.
    """
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not isinstance(data, bytes):
        raise TypeError("only bytes can be sealed")
    key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(12)
    wrapped = _load(public_key_path, private=False).encrypt(key, _oaep())
    box = AESGCM(key).encrypt(nonce, data, SCHEME.encode("ascii"))
    return {"sealed": SCHEME, "key": base64.b64encode(wrapped).decode("ascii"),
            "nonce": base64.b64encode(nonce).decode("ascii"),
            "data": base64.b64encode(box).decode("ascii")}


def is_sealed(value):
    """Whether ``value`` looks like what :func:`seal` returns."""
    return isinstance(value, dict) and value.get("sealed") == SCHEME


def unseal(private_key_path, sealed):
    """
    Open what :func:`seal` sealed to the public half of the RSA key in
    ``private_key_path``. Returns the bytes; raises ValueError for anything that is not
    sealed, not sealed to this key, or changed on the way.
    """
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not is_sealed(sealed):
        raise ValueError("not a sealed value")
    try:
        wrapped, nonce, box = (base64.b64decode(sealed[k], validate=True)
                               for k in ("key", "nonce", "data"))
        key = _load(private_key_path, private=True).decrypt(wrapped, _oaep())
        return AESGCM(key).decrypt(nonce, box, SCHEME.encode("ascii"))
    except (KeyError, TypeError, ValueError, InvalidTag) as exc:
        raise ValueError(f"cannot open a sealed value: {type(exc).__name__}") from None
