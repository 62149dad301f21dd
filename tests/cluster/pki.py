"""The test control plane's certificates and keys.

One CA signs the API server's serving certificate (for 127.0.0.1 and the
in-cluster names) and a client certificate per component, each with the
identity a real cluster gives it, so that RBAC's bootstrap roles apply as they
do in production: the controller manager is `system:kube-controller-manager`,
the scheduler `system:kube-scheduler`, the admin is in `system:masters`.
The service-account signing key makes TokenRequest work.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# The identity (CN, O) each client certificate carries.
CLIENTS = {
    "admin": ("gpulease-test-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", ""),
    "scheduler": ("system:kube-scheduler", ""),
    "kwok": ("gpulease-test-kwok", "system:masters"),
    "kubelet-emulator": ("gpulease-test-kubelet-emulator", "system:masters"),
}


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    @property
    def serving_cert(self) -> Path:
        return self.folder / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.folder / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.folder / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.folder / "sa.pub"

    def client(self, who: str) -> tuple[Path, Path]:
        return self.folder / f"{who}.crt", self.folder / f"{who}.key"


def _name(cn: str, org: str = "") -> x509.Name:
    parts = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(parts)


def _write_key(key, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _sign(subject: x509.Name, public_key, ca_key, issuer: x509.Name, *, ca: bool,
          usage: list, sans: list | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
               .public_key(public_key).serial_number(x509.random_serial_number())
               .not_valid_before(now - dt.timedelta(minutes=5))
               .not_valid_after(now + dt.timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usage:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return builder.sign(ca_key, hashes.SHA256())


def make_pki(folder: Path, service_ip: str) -> Pki:
    """Write a fresh CA, serving and client certificates and the SA key pair into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    pki = Pki(folder)
    # EC keys: generating RSA keys for six identities would cost seconds per start.
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpulease-test-ca")
    ca_cert = _sign(ca_name, ca_key.public_key(), ca_key, ca_name, ca=True, usage=[])
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))

    serving_key = ec.generate_private_key(ec.SECP256R1())
    sans = [x509.DNSName(n) for n in ("localhost", "kubernetes", "kubernetes.default",
                                      "kubernetes.default.svc",
                                      "kubernetes.default.svc.cluster.local")]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ("127.0.0.1", service_ip)]
    serving = _sign(_name("kube-apiserver"), serving_key.public_key(), ca_key, ca_name,
                    ca=False, usage=[ExtendedKeyUsageOID.SERVER_AUTH], sans=sans)
    pki.serving_cert.write_bytes(serving.public_bytes(serialization.Encoding.PEM))
    _write_key(serving_key, pki.serving_key)

    for who, (cn, org) in CLIENTS.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _sign(_name(cn, org), key.public_key(), ca_key, ca_name, ca=False,
                     usage=[ExtendedKeyUsageOID.CLIENT_AUTH])
        crt, key_path = pki.client(who)
        crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)

    # Service-account tokens are RS256 by default; the API server verifies with
    # the public half and the controller manager signs legacy tokens with it.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(sa_key, pki.sa_key)
    pki.sa_pub.write_bytes(sa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki
