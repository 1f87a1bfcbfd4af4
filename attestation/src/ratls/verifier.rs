//! rustls certificate verifiers that appraise RA-TLS evidence.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};

use super::decode_certificate;
use crate::error::Error;
use crate::evidence::EvidenceBundle;
use crate::policy::Policy;
use crate::verify::{verify, verify_deferring_gpus, ExpectedClaims, VerifiedEvidence};

const CACHE_ENTRIES: usize = 64;

/// Verifies a peer's RA-TLS certificate against a policy; used as both the
/// server-certificate and client-certificate verifier.
pub struct RaTlsVerifier {
    policy: Arc<Policy>,
    expected: ExpectedClaims,
    provider: Arc<CryptoProvider>,
    verified: Mutex<Vec<([u8; 32], VerifiedEvidence)>>,
}

impl std::fmt::Debug for RaTlsVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaTlsVerifier").field("policy", &self.policy).finish_non_exhaustive()
    }
}

impl RaTlsVerifier {
    /// A verifier for `policy`. `expected` pins what the relying party
    /// requires of the peer's claims (layer range, manifest root, …); the TLS
    /// key hash is always pinned to the presented certificate's key.
    pub fn new(policy: Arc<Policy>, expected: ExpectedClaims) -> Self {
        Self {
            policy,
            expected,
            // Links negotiate the hybrid post-quantum group only (`pq`).
            provider: super::pq::link_provider(),
            verified: Mutex::new(Vec::new()),
        }
    }

    /// The crypto provider the TLS configs must use.
    pub fn provider(&self) -> Arc<CryptoProvider> {
        self.provider.clone()
    }

    /// Appraises a certificate's evidence at `now`: everything but the GPU
    /// evidence its claims commit to, which arrives after the handshake
    /// ([`VerifiedPeer::establish`](super::VerifiedPeer::establish) verifies the whole).
    pub fn verify_certificate(&self, cert_der: &[u8], now: SystemTime) -> Result<VerifiedEvidence, Error> {
        let (bundle, key_hash) = decode_certificate(cert_der)?;
        let expected = ExpectedClaims { tls_key_hash: Some(key_hash), ..self.expected.clone() };
        let verified = verify_deferring_gpus(&bundle, &self.policy, &expected, now)?;
        let mut cache = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((Sha256::digest(cert_der).into(), verified.clone()));
        Ok(verified)
    }

    /// Verifies the whole evidence of a peer whose certificate passed the
    /// handshake: `bundle` is the certificate's with the GPU evidence received
    /// after it, under the same policy and pins.
    pub fn verify_whole(&self, bundle: &EvidenceBundle, cert_der: &[u8]) -> Result<VerifiedEvidence, Error> {
        let (_, key_hash) = decode_certificate(cert_der)?;
        let expected = ExpectedClaims { tls_key_hash: Some(key_hash), ..self.expected.clone() };
        verify(bundle, &self.policy, &expected, SystemTime::now())
    }

    /// The evidence verified for `cert_der` during a handshake.
    pub fn verified_for(&self, cert_der: &[u8]) -> Result<VerifiedEvidence, Error> {
        let digest: [u8; 32] = Sha256::digest(cert_der).into();
        let cache = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        cache
            .iter()
            .rev()
            .find(|(d, _)| *d == digest)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| Error::ApiMisuse("peer certificate was not verified by this verifier".into()))
    }

    fn check(&self, end_entity: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now.as_secs());
        self.verify_certificate(end_entity.as_ref(), now).map(|_| ()).map_err(|e| {
            tracing::warn!(error = %e, "RA-TLS peer refused");
            rustls::Error::InvalidCertificate(rustls::CertificateError::Other(rustls::OtherError(Arc::new(e))))
        })
    }

    fn tls13(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }
}

/// RA-TLS keys are ECDSA P-256 (see `RaTlsIdentity`).
const SCHEMES: [SignatureScheme; 1] = [SignatureScheme::ECDSA_NISTP256_SHA256];

/// The configs offer TLS 1.3 only; a TLS 1.2 signature means a misbuilt config.
fn tls12_refused() -> rustls::Error {
    rustls::Error::General("RA-TLS requires TLS 1.3".into())
}

impl ServerCertVerifier for RaTlsVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // Identity is the evidence, not a name: the server name is not used.
        self.check(end_entity, now).map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        SCHEMES.to_vec()
    }
}

impl ClientCertVerifier for RaTlsVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.check(end_entity, now).map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Err(tls12_refused())
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.tls13(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        SCHEMES.to_vec()
    }
}
