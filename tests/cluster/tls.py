"""The test cluster's TLS: a CA of its own, the hub's wildcard certificate and the API's.

A real site gives DockerMPI certificates from its own CA or a public one (pillar
``mpi:hub:tls``, ``mpi:api:tls``); the test cluster makes them when its master is created
and keeps them in the master's generated pillar (``/srv/pillar-local``), the private keys
in files that only the host using each is given (``pillar/top.sls``).
"""

import datetime
import hashlib
import base64
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 30


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert):
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _issue(subject_key, common_name, issuer_name, issuer_key, names=(), ca=False):
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer_name)
        .public_key(subject_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None),
                       critical=True)
    )
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
    else:
        alt = []
        for name in names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alt.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def self_signed_files(directory, address="127.0.0.1"):
    """A certificate for ``address`` that is its own CA, and its key: (certificate file,
    key file) in ``directory``, for a local test server and the client that trusts it."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dockermpi test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address(address))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256()))
    cert_file, key_file = directory / "api.pem", directory / "api.key"
    cert_file.write_text(_cert_pem(certificate))
    key_file.write_text(_pem(key))
    return cert_file, key_file


def make(hub_domain, api_address):
    """PEM text of a new CA and of two server certificates it signs: the hub's, for
    ``hub_domain`` and ``*.hub_domain`` (users' servers and the API's origin), and the
    API's, for its address on the master and its public name (the proxy forwards the
    name a client asked for, and checks the API's certificate against it). Returns
    {ca, hub_cert, hub_key, api_cert, api_key}."""
    ca_key = _key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "DockerMPI test cluster CA")])
    ca = _issue(ca_key, "DockerMPI test cluster CA", ca_name, ca_key, ca=True)
    hub_key, api_key = _key(), _key()
    hub = _issue(hub_key, hub_domain, ca_name, ca_key, names=(hub_domain, f"*.{hub_domain}"))
    api = _issue(api_key, api_address, ca_name, ca_key,
                 names=(api_address, f"dockermpi--service.{hub_domain}"))
    return {"ca": _cert_pem(ca), "hub_cert": _cert_pem(hub), "hub_key": _pem(hub_key),
            "api_cert": _cert_pem(api), "api_key": _pem(api_key)}


def spki_sha256(cert_pem):
    """Base64 SHA-256 of a certificate's public key (Chromium's
    --ignore-certificate-errors-spki-list trusts exactly that key)."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(spki).digest()).decode()
