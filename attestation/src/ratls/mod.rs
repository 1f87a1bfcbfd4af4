//! RA-TLS: attestation evidence inside TLS certificates, verified by rustls.
//!
//! ```text
//!  shard A                                              shard B
//!  ───────                                              ───────
//!  P-256 key kA; claims.tls_key_hash = SHA-256(SPKI(kA))
//!  cert(kA) + extension 2.23.133.5.4.9 = evidence(claims)
//!            ──────────── TLS 1.3, mutual auth ────────────▶
//!  RaTlsVerifier (both sides): decode extension → verify(bundle, policy,
//!     expected{tls_key_hash = SHA-256(SPKI(cert))}, now) → cache VerifiedEvidence
//!            ◀──── sign_k(label ‖ role ‖ TLS exporter) both ways ────▶
//!  VerifiedPeer (evidence + proof the attested key holds *this* connection)
//! ```
//!
//! The certificate key must be the key bound in REPORT_DATA (through the
//! claims), so evidence copied into another certificate fails the binding
//! check. TLS 1.3's CertificateVerify already proves possession of the key;
//! in addition each side signs the connection's exporter value, so evidence
//! cannot be replayed onto another connection even by a party that relays a
//! handshake.
//!
//! The extension value is a RATS Conceptual Message Wrapper in its JSON
//! array form: `["application/vnd.veil.evidence+json;v=1", "<base64url bundle>"]`.
//!
//! GPU evidence does not ride in the certificate (eight GPUs' SPDM
//! transcripts and device chains exceed the 64 KiB handshake message): the
//! certificate's claims commit to its digest (through REPORT_DATA), and each
//! side sends its GPU evidence right after the handshake, with its binding
//! signature. The peer is verified as one composite bundle — the
//! certificate's SNP evidence with the GPUs received — before it is a
//! [`VerifiedPeer`] (SECURITY-CASES D8).

/// The hybrid post-quantum TLS group links negotiate (crate `veil-tls-pq`).
pub use veil_tls_pq as pq;
mod verifier;

use std::sync::Arc;

use base64::Engine;
use const_oid::ObjectIdentifier;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::pkcs8::{DecodePublicKey, EncodePrivateKey};
use rcgen::{CertificateParams, CustomExtension, DnType, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub use verifier::RaTlsVerifier;

use crate::attester::Attester;
use crate::claims::{Claims, KeyHash};
use crate::error::{Error, Malformed};
use crate::evidence::{EvidenceBundle, MAX_BUNDLE_BYTES};
use crate::verify::VerifiedEvidence;
use crate::x509::ParsedCert;

#[cfg(feature = "tokio")]
pub mod tokio;

/// `tcg-dice-conceptual-message-wrapper` (TCG DICE Attestation Architecture).
pub const EVIDENCE_EXTENSION_OID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.5.4.9");
/// Media type inside the CMW record.
pub const EVIDENCE_MEDIA_TYPE: &str = "application/vnd.veil.evidence+json;v=1";
/// TLS exporter label for the channel binding.
pub const EXPORTER_LABEL: &[u8] = b"EXPORTER-veil-ra-tls-binding";
/// Domain separator of the binding signature.
pub const BINDING_DOMAIN: &[u8] = b"veil/ra-tls/binding/v1\0";
/// Longest binding signature accepted (DER ECDSA P-256 is at most 72 bytes).
pub const MAX_BINDING_SIGNATURE: usize = 128;
/// Longest GPU evidence accepted after the handshake (sixteen GPUs fit).
pub const MAX_POST_HANDSHAKE_GPU_BYTES: usize = 1 << 20;

/// Which end of the connection signs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that connected.
    Client,
    /// The side that accepted.
    Server,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Self::Client => 1,
            Self::Server => 2,
        }
    }
    /// The other end.
    pub fn peer(self) -> Self {
        match self {
            Self::Client => Self::Server,
            Self::Server => Self::Client,
        }
    }
}

fn binding_message(role: Role, exporter: &[u8]) -> Vec<u8> {
    let mut m = BINDING_DOMAIN.to_vec();
    m.push(role.byte());
    m.extend_from_slice(exporter);
    m
}

/// A TLS key with a certificate carrying evidence that binds it (the GPU
/// evidence its claims commit to travels after the handshake).
pub struct RaTlsIdentity {
    key: p256::SecretKey,
    cert_der: Vec<u8>,
    bundle: EvidenceBundle,
}

impl std::fmt::Debug for RaTlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaTlsIdentity").field("key", &"<redacted>").finish_non_exhaustive()
    }
}

impl RaTlsIdentity {
    /// Generates a fresh TLS key, binds its hash into `claims`, asks the
    /// attester for evidence and issues the certificate.
    pub fn new(attester: &dyn Attester, mut claims: Claims) -> Result<Self, Error> {
        let key = p256::SecretKey::random(&mut rand_core::OsRng);
        claims.tls_key_hash = Some(tls_key_hash(&key)?);
        let bundle = attester.evidence(&claims)?;
        Self::from_key_and_evidence(key, bundle)
    }

    /// Issues a certificate for `key` carrying `bundle` as is. Verifiers
    /// still check that the bundle binds this key; this exists for callers
    /// that produce evidence themselves, and for adversarial tests.
    pub fn from_key_and_evidence(key: p256::SecretKey, bundle: EvidenceBundle) -> Result<Self, Error> {
        let kp = rcgen_key(&key)?;
        // GPU evidence follows the handshake; the carried RIMs and OCSP responses
        // (tens of KiB) travel only in the route's attestation document.
        let in_certificate =
            EvidenceBundle { gpus: Vec::new(), gpu_rims: Vec::new(), gpu_ocsp: Vec::new(), ..bundle.clone() };
        let mut params = CertificateParams::new(vec!["veil-shard.invalid".to_owned()])
            .map_err(|e| Error::ApiMisuse(e.to_string()))?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "veil shard (RA-TLS)");
        let oid: Vec<u64> = EVIDENCE_EXTENSION_OID.arcs().map(u64::from).collect();
        params.custom_extensions = vec![CustomExtension::from_oid_content(&oid, encode_extension(&in_certificate))];
        let cert = params.self_signed(&kp).map_err(|e| Error::ApiMisuse(e.to_string()))?;
        Ok(Self { key, cert_der: cert.der().to_vec(), bundle })
    }

    /// The certificate (DER).
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The whole evidence: the certificate's, with the GPU evidence sent
    /// after the handshake.
    pub fn bundle(&self) -> &EvidenceBundle {
        &self.bundle
    }

    /// The GPU evidence sent after the handshake, with the RIMs and OCSP
    /// responses the shard carries (empty without GPUs).
    pub fn post_handshake_gpus(&self) -> Vec<u8> {
        self.bundle.post_handshake_json()
    }

    /// Certificate chain and key for a rustls config.
    pub fn rustls_parts(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
        let pkcs8 = self.key.to_pkcs8_der().map_err(|e| Error::ApiMisuse(e.to_string()))?;
        Ok((
            vec![CertificateDer::from(self.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.as_bytes().to_vec())),
        ))
    }

    /// Signs the channel binding for `role` over this connection's exporter value.
    pub fn sign_binding(&self, role: Role, exporter: &[u8]) -> Vec<u8> {
        let sk = p256::ecdsa::SigningKey::from(&self.key);
        let sig: p256::ecdsa::Signature = sk.sign(&binding_message(role, exporter));
        sig.to_der().as_bytes().to_vec()
    }
}

fn rcgen_key(key: &p256::SecretKey) -> Result<KeyPair, Error> {
    let der = key.to_pkcs8_der().map_err(|e| Error::ApiMisuse(e.to_string()))?;
    KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(der.as_bytes()), &rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| Error::ApiMisuse(e.to_string()))
}

/// SHA-256 of the SubjectPublicKeyInfo of a P-256 key.
pub fn tls_key_hash(key: &p256::SecretKey) -> Result<KeyHash, Error> {
    use p256::pkcs8::EncodePublicKey;
    let spki = key.public_key().to_public_key_der().map_err(|e| Error::ApiMisuse(e.to_string()))?;
    Ok(KeyHash::of(spki.as_bytes()))
}

/// Largest RA-TLS certificate accepted: the SNP evidence and claims ride in
/// it (GPU evidence follows the handshake), and rustls caps a handshake
/// message at 64 KiB.
pub const MAX_RATLS_CERT_BYTES: usize = 60 * 1024;

fn encode_extension(bundle: &EvidenceBundle) -> Vec<u8> {
    // Compact JSON: the certificate travels in every handshake.
    let value = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bundle.to_compact_json());
    // Invariant: an array of two strings always serialises.
    serde_json::to_vec(&(EVIDENCE_MEDIA_TYPE, value)).unwrap_or_default()
}

/// Decodes the evidence extension of a certificate and the hash of the
/// certificate's key. The parser every RA-TLS verifier runs on untrusted bytes.
pub fn decode_certificate(cert_der: &[u8]) -> Result<(EvidenceBundle, KeyHash), Error> {
    let cert = ParsedCert::from_der_limited(cert_der, MAX_RATLS_CERT_BYTES)
        .map_err(|e| Malformed::Certificate(e.to_string()))?;
    let ext = cert
        .extension(EVIDENCE_EXTENSION_OID)
        .map_err(|e| Malformed::Certificate(e.to_string()))?
        .ok_or_else(|| Malformed::Certificate("no evidence extension (2.23.133.5.4.9)".into()))?;
    let bundle = decode_extension(ext)?;
    Ok((bundle, KeyHash(cert.spki_sha256())))
}

/// Decodes the CMW record of the evidence extension.
pub fn decode_extension(ext: &[u8]) -> Result<EvidenceBundle, Error> {
    if ext.len() > MAX_BUNDLE_BYTES * 4 / 3 + 128 {
        return Err(Malformed::TooLarge { actual: ext.len(), limit: MAX_BUNDLE_BYTES }.into());
    }
    let (media, value): (String, String) = serde_json::from_slice(ext)
        .map_err(|e| Malformed::Certificate(format!("evidence extension is not a CMW record: {e}")))?;
    if media != EVIDENCE_MEDIA_TYPE {
        return Err(Malformed::Certificate(format!("unsupported evidence media type {media:?}")).into());
    }
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value)
        .map_err(|e| Malformed::Certificate(format!("evidence is not base64url: {e}")))?;
    Ok(EvidenceBundle::from_json(&json)?)
}

/// Verifies a peer's channel-binding signature with its certificate key.
pub fn verify_binding(peer_cert_der: &[u8], peer_role: Role, exporter: &[u8], signature: &[u8]) -> Result<(), Error> {
    let cert = ParsedCert::from_der_limited(peer_cert_der, MAX_RATLS_CERT_BYTES)
        .map_err(|e| Malformed::Certificate(e.to_string()))?;
    let key = p256::ecdsa::VerifyingKey::from_public_key_der(&cert.spki_der())
        .map_err(|_| Error::PeerMisbehaved("RA-TLS certificate key is not ECDSA P-256".into()))?;
    let sig = p256::ecdsa::Signature::from_der(signature)
        .map_err(|_| Error::PeerMisbehaved("channel-binding signature is not DER ECDSA".into()))?;
    key.verify(&binding_message(peer_role, exporter), &sig).map_err(|_| {
        Error::PeerMisbehaved(
            "channel-binding signature does not verify: evidence is not bound to this connection".into(),
        )
    })
}

/// A peer whose evidence — the certificate's, with the GPU evidence it sent
/// after the handshake — passed the policy, and whose attested key signed
/// this connection's exporter value. Only [`VerifiedPeer::establish`] makes one.
#[derive(Clone, Debug)]
pub struct VerifiedPeer {
    evidence: VerifiedEvidence,
    bundle: EvidenceBundle,
    key_hash: KeyHash,
    _private: (),
}

impl VerifiedPeer {
    /// Checks the peer's binding signature, then verifies its whole evidence:
    /// the certificate's bundle (appraised by `verifier` during the handshake)
    /// with `peer_gpus`, the GPU evidence it sent after the handshake (empty
    /// when it has none), against the same policy and pins.
    pub fn establish(
        verifier: &RaTlsVerifier,
        peer_cert_der: &[u8],
        peer_role: Role,
        exporter: &[u8],
        signature: &[u8],
        peer_gpus: &[u8],
    ) -> Result<Self, Error> {
        let handshake = verifier.verified_for(peer_cert_der)?;
        verify_binding(peer_cert_der, peer_role, exporter, signature)?;
        let (mut bundle, _) = decode_certificate(peer_cert_der)?;
        if !bundle.gpus.is_empty() || !bundle.gpu_rims.is_empty() || !bundle.gpu_ocsp.is_empty() {
            return Err(Error::PeerMisbehaved(
                "GPU evidence and its RIMs belong after the handshake, not in the certificate".into(),
            ));
        }
        if !peer_gpus.is_empty() {
            if peer_gpus.len() > MAX_POST_HANDSHAKE_GPU_BYTES {
                return Err(Malformed::TooLarge { actual: peer_gpus.len(), limit: MAX_POST_HANDSHAKE_GPU_BYTES }.into());
            }
            bundle.add_post_handshake_json(peer_gpus)?;
        }
        let evidence = verifier.verify_whole(&bundle, peer_cert_der)?;
        // The verifier pinned the claims' TLS key hash to this certificate's key.
        let key_hash = handshake
            .claims()
            .and_then(|c| c.tls_key_hash)
            .ok_or_else(|| Error::ApiMisuse("verified RA-TLS evidence without a TLS key hash".into()))?;
        Ok(Self { evidence, bundle, key_hash, _private: () })
    }

    /// The peer's verified evidence.
    pub fn evidence(&self) -> &VerifiedEvidence {
        &self.evidence
    }

    /// The evidence as the peer presented it (certificate and GPUs), for
    /// relying parties further out.
    pub fn bundle(&self) -> &EvidenceBundle {
        &self.bundle
    }

    /// Hash of the peer's TLS key.
    pub fn key_hash(&self) -> KeyHash {
        self.key_hash
    }
}

/// TLS 1.3 configs for both ends, with the RA-TLS verifier on both sides.
pub fn client_config(identity: &RaTlsIdentity, verifier: Arc<RaTlsVerifier>) -> Result<rustls::ClientConfig, Error> {
    let (chain, key) = identity.rustls_parts()?;
    rustls::ClientConfig::builder_with_provider(verifier.provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::ApiMisuse(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(|e| Error::ApiMisuse(e.to_string()))
}

/// Server side of [`client_config`]: client certificates are mandatory.
pub fn server_config(identity: &RaTlsIdentity, verifier: Arc<RaTlsVerifier>) -> Result<rustls::ServerConfig, Error> {
    let (chain, key) = identity.rustls_parts()?;
    rustls::ServerConfig::builder_with_provider(verifier.provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| Error::ApiMisuse(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| Error::ApiMisuse(e.to_string()))
}

/// Recovers our typed error from a rustls handshake error, when it is one.
pub fn error_from_rustls(err: &rustls::Error) -> Error {
    if let rustls::Error::InvalidCertificate(rustls::CertificateError::Other(other)) = err {
        if let Some(ours) = other.0.downcast_ref::<Error>() {
            return ours.duplicate();
        }
    }
    Error::PeerMisbehaved(format!("TLS handshake failed: {err}"))
}
