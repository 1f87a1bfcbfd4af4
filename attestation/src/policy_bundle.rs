//! Signed, versioned policy bundles (SECURITY-CASES C7).
//!
//! TCB minimums, product lists and measurement allowlists go stale: AMD
//! bulletins raise the safe minimum, images are rebuilt. A relying party that
//! takes its policy from a publisher (its security team, a vendor) needs to
//! know the file is the publisher's and not an older one replayed to it. A
//! bundle is the policy's TOML text with a version number, signed with the
//! publisher's ECDSA P-256 key:
//!
//! ```json
//! {"format":"veil-policy-bundle/v1","version":7,"policy":"products = [\"Genoa\"]\n…",
//!  "signature":"<hex DER ECDSA P-256 over SHA-256 of the signed message>"}
//! ```
//!
//! The signed message is `"veil/policy-bundle/v1\0" ‖ version (u64 BE) ‖
//! policy text`. [`open`] checks the signature against the keys the relying
//! party trusts, refuses a version below the highest it has already accepted
//! from that key (the floor, kept by the caller), and only then parses the
//! policy.

use p256::ecdsa::signature::{Signer, Verifier};
use p256::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, LineEnding};
use serde::{Deserialize, Serialize};

use crate::claims::KeyHash;
use crate::policy::{Policy, PolicyError};

/// The `format` field of a bundle.
pub const BUNDLE_FORMAT: &str = "veil-policy-bundle/v1";
/// Domain separator of the signed message.
pub const BUNDLE_DOMAIN: &[u8] = b"veil/policy-bundle/v1\0";
/// Largest bundle accepted.
pub const MAX_BUNDLE_BYTES: usize = 1 << 20;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    format: String,
    version: u64,
    policy: String,
    signature: String,
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BundleError {
    /// Not a bundle (size, JSON, format).
    #[error("not a policy bundle: {0}")]
    Malformed(String),
    /// The signature does not verify with any trusted key.
    #[error("the policy bundle's signature does not verify with any trusted key")]
    BadSignature,
    /// A version below one already accepted from the same publisher.
    #[error(
        "policy bundle version {bundle} is older than version {seen} already accepted from this publisher (rollback)"
    )]
    Rollback {
        /// The bundle's version.
        bundle: u64,
        /// The highest version accepted before.
        seen: u64,
    },
    /// Signed and current, but the policy inside is not valid.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

/// A policy whose bundle verified.
#[derive(Clone, Debug)]
pub struct SignedPolicy {
    /// The policy.
    pub policy: Policy,
    /// Its version.
    pub version: u64,
    /// SHA-256 of the signing key's SubjectPublicKeyInfo (the publisher).
    pub signer: KeyHash,
}

/// Whether `bytes` look like a bundle (a JSON object naming the format)
/// rather than a TOML policy.
pub fn is_bundle(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(256)]);
    text.trim_start().starts_with('{') && text.contains(BUNDLE_FORMAT)
}

fn message(version: u64, policy: &str) -> Vec<u8> {
    [BUNDLE_DOMAIN, &version.to_be_bytes(), policy.as_bytes()].concat()
}

/// SHA-256 of a public key's SubjectPublicKeyInfo.
pub fn key_hash(key: &p256::PublicKey) -> KeyHash {
    let spki = key.to_public_key_der().map(|d| d.as_bytes().to_vec()).unwrap_or_default();
    KeyHash::of(&spki)
}

/// Parses a PEM public key (`-----BEGIN PUBLIC KEY-----`).
pub fn public_key_from_pem(pem: &str) -> Result<p256::PublicKey, BundleError> {
    p256::PublicKey::from_public_key_pem(pem)
        .map_err(|e| BundleError::Malformed(format!("not an ECDSA P-256 public key (PEM): {e}")))
}

/// Verifies `bytes` against `trusted` keys and the caller's rollback floor
/// (`floor(signer)`: the highest version accepted before from that key).
pub fn open(
    bytes: &[u8],
    trusted: &[p256::PublicKey],
    floor: impl Fn(&KeyHash) -> Option<u64>,
) -> Result<SignedPolicy, BundleError> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(BundleError::Malformed(format!("{} bytes exceeds {MAX_BUNDLE_BYTES}", bytes.len())));
    }
    let wire: Wire = serde_json::from_slice(bytes).map_err(|e| BundleError::Malformed(e.to_string()))?;
    if wire.format != BUNDLE_FORMAT {
        return Err(BundleError::Malformed(format!("format {:?}, expected {BUNDLE_FORMAT:?}", wire.format)));
    }
    let der = hex::decode(&wire.signature).map_err(|_| BundleError::Malformed("signature is not hex".into()))?;
    let sig = p256::ecdsa::Signature::from_der(&der).map_err(|_| BundleError::BadSignature)?;
    let msg = message(wire.version, &wire.policy);
    let signer = trusted
        .iter()
        .find(|k| p256::ecdsa::VerifyingKey::from(**k).verify(&msg, &sig).is_ok())
        .ok_or(BundleError::BadSignature)?;
    let signer = key_hash(signer);
    if let Some(seen) = floor(&signer) {
        if wire.version < seen {
            return Err(BundleError::Rollback { bundle: wire.version, seen });
        }
    }
    let policy = Policy::from_toml(&wire.policy)?;
    Ok(SignedPolicy { policy, version: wire.version, signer })
}

/// A publisher's signing key.
pub struct PolicySigner {
    key: p256::SecretKey,
}

impl std::fmt::Debug for PolicySigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicySigner").field("public", &key_hash(&self.key.public_key())).finish_non_exhaustive()
    }
}

impl PolicySigner {
    /// A fresh key from the OS's randomness.
    pub fn generate() -> Self {
        Self { key: p256::SecretKey::random(&mut rand_core::OsRng) }
    }

    /// From a PKCS#8 PEM private key.
    pub fn from_pem(pem: &str) -> Result<Self, BundleError> {
        p256::SecretKey::from_pkcs8_pem(pem)
            .map(|key| Self { key })
            .map_err(|e| BundleError::Malformed(format!("not an ECDSA P-256 private key (PKCS#8 PEM): {e}")))
    }

    /// The private key as PKCS#8 PEM (keep it secret).
    pub fn private_pem(&self) -> Result<String, BundleError> {
        self.key.to_pkcs8_pem(LineEnding::LF).map(|p| p.to_string()).map_err(|e| BundleError::Malformed(e.to_string()))
    }

    /// The public key as PEM, for relying parties.
    pub fn public_pem(&self) -> Result<String, BundleError> {
        self.key.public_key().to_public_key_pem(LineEnding::LF).map_err(|e| BundleError::Malformed(e.to_string()))
    }

    /// The public key.
    pub fn public_key(&self) -> p256::PublicKey {
        self.key.public_key()
    }

    /// Signs `policy_toml` as `version`; refuses text that is not a valid policy.
    pub fn sign(&self, policy_toml: &str, version: u64) -> Result<Vec<u8>, BundleError> {
        Policy::from_toml(policy_toml)?;
        let sk = p256::ecdsa::SigningKey::from(&self.key);
        let sig: p256::ecdsa::Signature = sk.sign(&message(version, policy_toml));
        let wire = Wire {
            format: BUNDLE_FORMAT.into(),
            version,
            policy: policy_toml.to_owned(),
            signature: hex::encode(sig.to_der().as_bytes()),
        };
        serde_json::to_vec_pretty(&wire).map_err(|e| BundleError::Malformed(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "products = [\"Genoa\"]\nallow_smt = false\n";

    #[test]
    fn a_signed_bundle_opens_with_its_version_and_publisher() {
        let signer = PolicySigner::generate();
        let bundle = signer.sign(POLICY, 7).unwrap();
        assert!(is_bundle(&bundle) && !is_bundle(POLICY.as_bytes()));
        let opened = open(&bundle, &[signer.public_key()], |_| None).unwrap();
        assert_eq!(opened.version, 7);
        assert!(!opened.policy.allow_smt);
        assert_eq!(opened.signer, key_hash(&signer.public_key()));
        // Keys survive their PEM round trips.
        let again = PolicySigner::from_pem(&signer.private_pem().unwrap()).unwrap();
        let public = public_key_from_pem(&signer.public_pem().unwrap()).unwrap();
        open(&again.sign(POLICY, 8).unwrap(), &[public], |_| None).unwrap();
    }

    #[test]
    fn edits_other_keys_and_rollbacks_are_refused() {
        let signer = PolicySigner::generate();
        let other = PolicySigner::generate();
        let bundle = signer.sign(POLICY, 7).unwrap();
        let trusted = [signer.public_key()];
        // The policy text edited (a weaker setting), or the version raised: the signature fails.
        for (from, to) in [("allow_smt = false", "allow_smt = true "), ("\"version\": 7", "\"version\": 9")] {
            let edited = String::from_utf8(bundle.clone()).unwrap().replace(from, to);
            assert_ne!(edited.as_bytes(), &bundle[..], "{from}");
            assert!(matches!(open(edited.as_bytes(), &trusted, |_| None), Err(BundleError::BadSignature)), "{from}");
        }
        // Signed by a key the relying party does not trust.
        let foreign = other.sign(POLICY, 7).unwrap();
        assert!(matches!(open(&foreign, &trusted, |_| None), Err(BundleError::BadSignature)));
        // An older version once a newer one was accepted from this publisher.
        let seen = |k: &KeyHash| (*k == key_hash(&signer.public_key())).then_some(8);
        assert!(matches!(open(&bundle, &trusted, seen), Err(BundleError::Rollback { bundle: 7, seen: 8 })));
        open(&signer.sign(POLICY, 8).unwrap(), &trusted, seen).unwrap();
        // An invalid policy cannot be signed, and junk is malformed.
        assert!(signer.sign("allow_smt = maybe", 9).is_err());
        assert!(matches!(open(b"{\"format\": 1}", &trusted, |_| None), Err(BundleError::Malformed(_))));
    }
}
