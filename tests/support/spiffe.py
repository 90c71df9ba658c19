"""Pod certificates as agent-substrate's Pod identity signer issues them, made with cryptography.

A :class:`Signer` is a CA (the ``podidentity.podcert.ate.dev/identity`` signer's role); its
:meth:`Signer.pod` issues a leaf with exactly one SPIFFE URI SAN
(``spiffe://cluster.local/ns/<ns>/sa/<sa>``) and the Pod identity extension
(``1.3.6.1.4.1.11129.2.12.1``, the JSON upstream's ``substratex509`` writes), ECDSA P-256 as
the projection asks. :meth:`PodCertificate.bundle` is the credential bundle file the kubelet
writes (``PRIVATE KEY`` then the chain); :meth:`Signer.trust_bundle` the ClusterTrustBundle's.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from substrate_gpu.service import atelet_dial

NODE = ("gpu-node-1", "6a1b8f0e-3c7d-4e2a-9f51-0d2c4b6e8a10")
ATELET_SA = ("ate-system", "atelet")
WORKER_SA = ("default", "worker")


def spiffe_id(namespace: str, service_account: str) -> str:
    return f"spiffe://cluster.local/ns/{namespace}/sa/{service_account}"


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class PodCertificate:
    """A leaf, its key and the chain above it."""

    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey
    chain: tuple[x509.Certificate, ...] = ()

    @property
    def key_pem(self) -> bytes:
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @property
    def chain_pem(self) -> bytes:
        return b"".join(_pem(c) for c in (self.certificate, *self.chain))

    def bundle(self) -> bytes:
        """The credential bundle: the key, then the chain leaf first."""
        return self.key_pem + self.chain_pem


def pod_identity_json(
    namespace: str, service_account: str, pod: str, node: tuple[str, str]
) -> bytes:
    return json.dumps(
        {
            "Namespace": namespace,
            "ServiceAccountName": service_account,
            "ServiceAccountUID": f"sa-uid-{service_account}",
            "PodName": pod,
            "PodUID": f"pod-uid-{pod}",
            "NodeName": node[0],
            "NodeUID": node[1],
        }
    ).encode()


@dataclass
class Signer:
    """A CA issuing Pod certificates."""

    name: str = "podidentity.podcert.ate.dev"
    key: ec.EllipticCurvePrivateKey = field(
        default_factory=lambda: ec.generate_private_key(ec.SECP256R1())
    )

    def __post_init__(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, self.name)])
        self.certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )

    def trust_bundle(self) -> bytes:
        return _pem(self.certificate)

    def pod(
        self,
        account: tuple[str, str],
        *,
        pod: str = "pod",
        node: tuple[str, str] | None = NODE,
        uris: Sequence[str] | None = None,
        identity: bytes | None = None,
        usages: Sequence[x509.ObjectIdentifier] = (
            ExtendedKeyUsageOID.SERVER_AUTH,
            ExtendedKeyUsageOID.CLIENT_AUTH,
        ),
    ) -> PodCertificate:
        """A Pod certificate of ``account`` (namespace, service account) on ``node`` (None:
        no Pod identity extension); ``uris``/``identity`` override the SAN and the JSON."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        names = [
            x509.UniformResourceIdentifier(u)
            for u in (uris if uris is not None else [spiffe_id(*account)])
        ]
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(
                x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if names:
            # No subject: the SAN carries the identity and must be critical (RFC 5280).
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=True)
        if identity is None and node is not None:
            identity = pod_identity_json(*account, pod, node)
        if identity is not None:
            builder = builder.add_extension(
                x509.UnrecognizedExtension(atelet_dial.POD_IDENTITY_OID, identity), critical=False
            )
        return PodCertificate(builder.sign(self.key, hashes.SHA256()), key)
