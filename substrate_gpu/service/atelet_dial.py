"""Dialling the node's atelet: the worker's Pod certificate out, only atelet's accepted back.

Upstream's worker reaches atelet's support socket through ``ateletdial`` (agent-substrate
533900d): mutual TLS over the Unix socket, the worker presenting its Pod certificate and
accepting only the atelet *of its own node*. This module does the same, check for check:

- **The credential bundle** (``--atunnel-credential-bundle``) is one PEM file as Kubernetes
  Pod Certificates write it: a ``PRIVATE KEY`` (PKCS #8), then ``CERTIFICATE`` blocks leaf
  first. Another block type, no key, no certificate, or a leaf without a valid Pod identity
  is refused.
- **The trust bundle** (``--atunnel-trust-bundle``): PEM certificates atelet's chain must
  reach, for server authentication (OpenSSL's ``ssl_server`` purpose: an extended key usage,
  when present, must allow it).
- **Who may answer**, checked after the handshake and before a byte of the request is
  sent: atelet's leaf carries exactly one URI SAN, equal to atelet's SPIFFE ID
  (``--atunnel-broker-identity``), and a Pod identity extension naming this worker's node
  (name and UID) — a trusted certificate of another workload, or of the atelet of another
  node, is not atelet.
- TLS 1.3 only, ALPN ``h2``, server name ``atelet`` (the authority upstream dials).

Why not grpcio's own TLS: its client verifies the peer's name against DNS names and has no
hook for a SPIFFE ID, so a server certificate that carries only a URI SAN (atelet's) fails
its handshake whatever target name is given. Python's :mod:`ssl` verifies the chain, the
checks above run on the verified leaf, and :mod:`.grpc_h2` carries the call.

Each attempt re-reads both bundles (the kubelet rotates Pod certificates in place); the
node identity is read once, when the :class:`AteletDialer` is made.
"""

from __future__ import annotations

import json
import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import anyio
from anyio.streams.tls import TLSAttribute, TLSStream
from cryptography import x509
from cryptography.hazmat.primitives.serialization import load_pem_private_key

from substrate_gpu import exceptions
from substrate_gpu.service import grpc_h2

__all__ = [
    "AUTHORITY",
    "POD_IDENTITY_OID",
    "AteletDialer",
    "AteletRefused",
    "CredentialError",
    "PodIdentity",
    "pod_identity",
]

AUTHORITY: Final = "atelet"
"""The ``:authority`` and TLS server name upstream's worker dials atelet by."""

POD_IDENTITY_OID: Final = x509.ObjectIdentifier("1.3.6.1.4.1.11129.2.12.1")
"""agent-substrate's Pod identity extension (its ``substratex509`` arc, id 1): JSON."""

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.DOTALL)


class CredentialError(exceptions.ConfigError):
    """A credential or trust bundle cannot be used (no retry will change that)."""


class AteletRefused(exceptions.SubstrateGpuError):
    """The peer on atelet's socket is not this node's atelet: nothing was sent to it."""


@dataclass(frozen=True)
class PodIdentity:
    """The Pod identity a certificate carries (agent-substrate's ``PodIdentity``)."""

    namespace: str
    service_account_name: str
    service_account_uid: str
    pod_name: str
    pod_uid: str
    node_name: str
    node_uid: str


#: PodIdentity's fields by the JSON keys Go writes them with.
_IDENTITY_KEYS: Final = {
    "Namespace": "namespace",
    "ServiceAccountName": "service_account_name",
    "ServiceAccountUID": "service_account_uid",
    "PodName": "pod_name",
    "PodUID": "pod_uid",
    "NodeName": "node_name",
    "NodeUID": "node_uid",
}


def pod_identity(certificate: x509.Certificate) -> PodIdentity | None:
    """The certificate's Pod identity; None when it has none. ``ValueError`` when it has an
    unusable one (not JSON, a field empty or missing, the extension twice)."""
    try:
        extension = certificate.extensions.get_extension_for_oid(POD_IDENTITY_OID)
    except x509.ExtensionNotFound:
        return None
    except x509.DuplicateExtension as e:
        raise ValueError("the certificate carries the Pod identity extension twice") from e
    raw = extension.value
    data = raw.value if isinstance(raw, x509.UnrecognizedExtension) else b""
    try:
        decoded: object = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"its Pod identity extension is not JSON ({e})") from e
    if not isinstance(decoded, dict):
        raise ValueError("its Pod identity extension is not a JSON object")  # noqa: TRY004
    # Go's encoding/json matches keys without regard to case.
    folded = {str(key).casefold(): value for key, value in decoded.items()}
    values: dict[str, str] = {}
    empty = []
    for key, name in _IDENTITY_KEYS.items():
        value = folded.get(key.casefold(), "")
        if not isinstance(value, str):
            raise ValueError(f"its Pod identity's {key} is not a string")  # noqa: TRY004
        if not value:
            empty.append(key)
        values[name] = value
    if empty:
        raise ValueError(f"its Pod identity has empty fields: {', '.join(empty)}")
    return PodIdentity(**values)


def _read(path: Path, what: str, flag: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise CredentialError(
            f"while reading the {what} {path}: {e.strerror or e}; check {flag} names the "
            "projected file (docs/worker-api.md, 'Registering with atelet')"
        ) from e


def read_credential_bundle(path: Path) -> x509.Certificate:
    """The leaf of the credential bundle at ``path``, after checking the whole bundle."""
    flag = "--atunnel-credential-bundle"
    data = _read(path, "credential bundle", flag)
    key: bytes | None = None
    chain: list[bytes] = []
    for match in _PEM_BLOCK.finditer(data):
        kind, body = match.group(1).decode(), match.group(0)
        if kind == "CERTIFICATE":
            chain.append(body)
        elif kind == "PRIVATE KEY":
            key = body
        else:
            raise CredentialError(
                f"credential bundle {path}: unknown PEM block type {kind!r} (a bundle holds "
                f"one PRIVATE KEY and its CERTIFICATE chain; check {flag})"
            )
    if key is None:
        raise CredentialError(f"credential bundle {path}: no PRIVATE KEY block found")
    if not chain:
        raise CredentialError(f"credential bundle {path}: no CERTIFICATE blocks found")
    try:
        load_pem_private_key(key, password=None)
        leaf = x509.load_pem_x509_certificate(chain[0])
    except (ValueError, TypeError) as e:
        raise CredentialError(f"credential bundle {path}: {e}") from e
    return leaf


def _trust_pem(path: Path) -> bytes:
    data = _read(path, "trust bundle", "--atunnel-trust-bundle")
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise CredentialError(f"trust bundle {path} contains no certificates")
    return data


class AteletDialer:
    """Connections to the node's atelet, verified as the module doc says."""

    def __init__(
        self, socket: Path, credential_bundle: Path, trust_bundle: Path, atelet_spiffe_id: str
    ) -> None:
        """Read the worker's own identity; :class:`CredentialError` when it cannot be used."""
        for flag, value in (
            ("--atunnel-credential-bundle", str(credential_bundle)),
            ("--atunnel-trust-bundle", str(trust_bundle)),
            ("--atunnel-broker-identity", atelet_spiffe_id),
        ):
            if not value or value == ".":
                raise CredentialError(
                    f"{flag} is empty: worker credentials, trust bundle, and atelet SPIFFE ID "
                    "are required to register with atelet"
                )
        self.socket = socket
        self.credential_bundle = credential_bundle
        self.trust_bundle = trust_bundle
        self.atelet_spiffe_id = atelet_spiffe_id
        leaf = read_credential_bundle(credential_bundle)
        try:
            identity = pod_identity(leaf)
        except ValueError as e:
            identity, problem = None, f": {e}"
        else:
            problem = ""
        if identity is None:
            raise CredentialError(
                f"the worker certificate in {credential_bundle} has no valid Pod identity"
                f"{problem or ' (no Pod identity extension)'}: it must come from the Pod "
                "identity signer (a podCertificate projection)"
            )
        self.identity = identity
        _trust_pem(trust_bundle)

    def _context(self) -> ssl.SSLContext:
        """A fresh client context from the bundles as they are now (they rotate)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        # The peer's identity is its SPIFFE ID and node, checked in verify(); the chain is
        # still verified against the trust bundle.
        context.check_hostname = False
        context.verify_mode = ssl.CERT_REQUIRED
        try:
            context.load_verify_locations(
                cadata=_trust_pem(self.trust_bundle).decode("ascii", "replace")
            )
            # The bundle holds the key and the chain: OpenSSL reads each from the one file.
            context.load_cert_chain(self.credential_bundle)
        except (ssl.SSLError, OSError) as e:
            raise CredentialError(
                f"while loading {self.credential_bundle} and {self.trust_bundle}: {e}"
            ) from e
        context.set_alpn_protocols([grpc_h2.ALPN])
        return context

    def verify(self, peer: bytes) -> None:
        """Refuse a peer (its DER leaf) that is not this node's atelet."""
        try:
            leaf = x509.load_der_x509_certificate(peer)
            sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
            uris = sans.value.get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            uris = []
        except (ValueError, x509.DuplicateExtension) as e:
            raise AteletRefused(f"node-local peer's certificate cannot be read: {e}") from e
        if uris != [self.atelet_spiffe_id]:
            raise AteletRefused(
                f"node-local peer is not atelet: it presents {_named(uris)}, not "
                f"{self.atelet_spiffe_id} (--atunnel-broker-identity)"
            )
        try:
            identity = pod_identity(leaf)
        except ValueError:
            identity = None
        mine = self.identity
        if identity is None or (identity.node_name, identity.node_uid) != (
            mine.node_name,
            mine.node_uid,
        ):
            raise AteletRefused(
                f"atelet is not on worker node {mine.node_name!r} ({mine.node_uid})"
            )

    async def call(self, path: str, request: bytes, *, timeout: float) -> bytes:
        """One unary call on atelet: connect, handshake, verify, call; the response bytes.

        Raises :class:`AteletRefused`, :class:`CredentialError` (a bundle unusable now),
        :class:`grpc_h2.GrpcError` (a status, a broken stream) or ``OSError`` (no socket,
        refused). The caller bounds the whole attempt.
        """
        context = self._context()
        stream = await anyio.connect_unix(self.socket)
        try:
            tls = await TLSStream.wrap(
                stream, hostname=AUTHORITY, ssl_context=context, standard_compatible=False
            )
        except BaseException:
            await anyio.aclose_forcefully(stream)
            raise
        async with tls:
            peer = tls.extra(TLSAttribute.peer_certificate_binary)  # noqa: S610 (anyio's)
            if peer is None:
                raise AteletRefused("node-local peer presented no certificate")
            self.verify(peer)
            if tls.extra(TLSAttribute.alpn_protocol) != grpc_h2.ALPN:  # noqa: S610
                raise AteletRefused(
                    f"node-local peer did not agree to {grpc_h2.ALPN!r} (ALPN): not a gRPC server"
                )
            return await grpc_h2.unary_call(
                tls, authority=AUTHORITY, path=path, request=request, timeout=timeout
            )


def _named(uris: list[str]) -> str:
    if not uris:
        return "no URI SAN"
    return ", ".join(uris) if len(uris) == 1 else f"{len(uris)} URI SANs ({', '.join(uris)})"
