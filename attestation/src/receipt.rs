//! Receipts: the entry's signed record of one answered request.
//!
//! The entry generates an Ed25519 key at start, inside the enclave, and
//! binds its public half into its claims (field 12, [`ReceiptKey`]), so a
//! client that verified the route knows the key. For every completed answer
//! the entry signs a [`Receipt`] and sends it as the last thing inside the
//! sealed response (the trailer field `veil-receipt`). It covers:
//!
//! - `request`: SHA-256 of the sealed request exactly as the entry received
//!   it (the ciphertext the client sent and the relay carried);
//! - `response`: SHA-256 of the response body as sealed (the plaintext the
//!   client reads: SSE events or the JSON answer, padding included);
//! - `model`: the entry's manifest root;
//! - `route`: the [`RouteId`] of the route that served it (see [`route_id`]);
//! - `shards`: the shards the session ran on, each by stage, replica and
//!   attested TLS key hash (the `veil-route` field);
//! - prompt and completion token counts, the drafter that ran, the entry's
//!   time, and a random receipt id.
//!
//! The signature is over a canonical, domain-separated encoding
//! ([`Receipt::signed_bytes`]): `"veil/receipt/v1\0"`, then for each field in
//! a fixed order `u8 id ‖ u32 BE length ‖ bytes`.
//!
//! A receipt proves that an entry holding the attested receipt key — which
//! only the attested entry can, unless its TEE is broken — answered a request
//! whose ciphertext hashes to `request` with a body hashing to `response`,
//! on the route `route`. It does not prove what the prompt said (only its
//! hash), that the time is right (it is the entry's clock), or that the
//! counts are what a billing party would count (they are the entry's).

use crate::invalid::{InvalidValue, ValueKind};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::claims::{Claims, ManifestRoot, Nonce, ReceiptKey};
use crate::route::{verify_route, AttestationDoc, RouteError, VerifiedRoute};
use crate::Policy;

/// Domain separator of a receipt's signed bytes.
pub const RECEIPT_DOMAIN: &[u8] = b"veil/receipt/v1\0";
/// Domain separator of [`route_id`].
pub const ROUTE_ID_DOMAIN: &[u8] = b"veil/receipt-route/v1\0";
/// The receipt format this code writes and reads.
pub const RECEIPT_VERSION: u32 = 1;
/// The saved-route format this code writes and reads.
pub const SAVED_ROUTE_VERSION: u32 = 1;
/// Longest receipt accepted, as JSON (a trailer field).
pub const MAX_RECEIPT_BYTES: usize = 4096;
/// Longest free-text field (drafter, shards) accepted in a receipt.
pub const MAX_RECEIPT_TEXT: usize = 1024;
/// How far before the route's verification a receipt's time may lie
/// (clock skew between the client and the entry).
pub const RECEIPT_SKEW: Duration = Duration::from_secs(300);

/// A SHA-256 digest in a receipt (hex in JSON).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest32(pub [u8; 32]);

impl Digest32 {
    /// SHA-256 of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }
}

impl fmt::Debug for Digest32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest32({})", hex::encode(self.0))
    }
}

impl fmt::Display for Digest32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl Serialize for Digest32 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(self.0))
    }
}

impl<'de> Deserialize<'de> for Digest32 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        let v = hex::decode(&s).map_err(serde::de::Error::custom)?;
        v.try_into().map(Self).map_err(|_| serde::de::Error::custom("a digest must be 32 bytes"))
    }
}

/// The identity of a route a receipt names: SHA-256 of
/// `"veil/receipt-route/v1\0" ‖ encode(entry claims without nonce, GPU
/// evidence hash and links commitment)`. It covers the entry's TLS and
/// sealing keys, receipt key, manifest root, layers, software version, the
/// peer policy every shard enforces, the route shape and the drafter. It
/// leaves out what changes with each verifier's nonce, and the set of
/// linked replicas, which changes when one restarts or joins: the receipt
/// names the shards the answer ran on in its signed `shards` field instead.
pub type RouteId = Digest32;

/// [`RouteId`] of the route whose entry makes `claims`.
pub fn route_id(claims: &Claims) -> Result<RouteId, InvalidValue> {
    let stable = Claims { nonce: None, gpu_evidence_hash: None, route_links: None, ..claims.clone() };
    let mut h = Sha256::new();
    h.update(ROUTE_ID_DOMAIN);
    h.update(stable.encode()?);
    Ok(Digest32(h.finalize().into()))
}

/// The receipt checks, in the order [`Receipt::check`] runs them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ReceiptCheck {
    /// The receipt is well-formed JSON of this version, within the limits.
    Format,
    /// The saved route document verifies against the policy (offline).
    RouteDocument,
    /// The entry's attested claims carry a receipt key, and it is the receipt's.
    Key,
    /// The receipt names the route that was verified.
    Route,
    /// The receipt names the model the entry attested.
    Model,
    /// The receipt covers the sealed request the client sent.
    Request,
    /// The receipt covers the body the client read.
    Response,
    /// The receipt's time is not before the route was verified.
    Time,
    /// The Ed25519 signature over every field verifies with the attested key.
    Signature,
}

impl ReceiptCheck {
    /// Stable snake_case name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Format => "format",
            Self::RouteDocument => "route_document",
            Self::Key => "key",
            Self::Route => "route",
            Self::Model => "model",
            Self::Request => "request",
            Self::Response => "response",
            Self::Time => "time",
            Self::Signature => "signature",
        }
    }
}

impl fmt::Display for ReceiptCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A receipt that failed a check.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("receipt check `{check}` failed: expected {expected}, got {actual}")]
pub struct ReceiptFailure {
    /// The check.
    pub check: ReceiptCheck,
    /// What it wanted.
    pub expected: String,
    /// What it found.
    pub actual: String,
}

fn fail(check: ReceiptCheck, expected: impl Into<String>, actual: impl Into<String>) -> ReceiptFailure {
    ReceiptFailure { check, expected: expected.into(), actual: actual.into() }
}

/// One answered request, signed by the entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    /// [`RECEIPT_VERSION`].
    pub version: u32,
    /// Random, 16 bytes, hex.
    pub id: String,
    /// The entry's clock when it finished the answer (Unix seconds).
    pub time: u64,
    /// SHA-256 of the sealed request as received.
    pub request: Digest32,
    /// SHA-256 of the response body as sealed.
    pub response: Digest32,
    /// The entry's manifest root.
    pub model: ManifestRoot,
    /// The route that served it.
    pub route: RouteId,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// The drafter that ran (`veil-drafter`).
    pub drafter: String,
    /// The shards the session ran on (`veil-route`).
    pub shards: String,
    /// The signing key (must be the attested one).
    pub key: ReceiptKey,
    /// Ed25519 over [`signed_bytes`](Self::signed_bytes), hex.
    pub signature: String,
}

fn tlv(out: &mut Vec<u8>, id: u8, value: &[u8]) {
    out.push(id);
    // Every field is bounded (≤ MAX_RECEIPT_TEXT bytes).
    out.extend_from_slice(&(value.len() as u32).to_be_bytes());
    out.extend_from_slice(value);
}

impl Receipt {
    /// The canonical bytes the signature covers (every field but the signature).
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(512);
        out.extend_from_slice(RECEIPT_DOMAIN);
        tlv(&mut out, 1, &self.version.to_be_bytes());
        tlv(&mut out, 2, self.id.as_bytes());
        tlv(&mut out, 3, &self.time.to_be_bytes());
        tlv(&mut out, 4, &self.request.0);
        tlv(&mut out, 5, &self.response.0);
        tlv(&mut out, 6, &self.model.0);
        tlv(&mut out, 7, &self.route.0);
        tlv(&mut out, 8, &self.prompt_tokens.to_be_bytes());
        tlv(&mut out, 9, &self.completion_tokens.to_be_bytes());
        tlv(&mut out, 10, self.drafter.as_bytes());
        tlv(&mut out, 11, self.shards.as_bytes());
        tlv(&mut out, 12, &self.key.0);
        out
    }

    /// Parses a receipt (JSON), within the limits.
    pub fn from_json(bytes: &[u8]) -> Result<Self, ReceiptFailure> {
        if bytes.len() > MAX_RECEIPT_BYTES {
            return Err(fail(
                ReceiptCheck::Format,
                format!("at most {MAX_RECEIPT_BYTES} bytes"),
                bytes.len().to_string(),
            ));
        }
        let r: Receipt =
            serde_json::from_slice(bytes).map_err(|e| fail(ReceiptCheck::Format, "a receipt (JSON)", e.to_string()))?;
        if r.version != RECEIPT_VERSION {
            return Err(fail(ReceiptCheck::Format, format!("version {RECEIPT_VERSION}"), r.version.to_string()));
        }
        if r.drafter.len() > MAX_RECEIPT_TEXT || r.shards.len() > MAX_RECEIPT_TEXT || r.id.len() != 32 {
            return Err(fail(ReceiptCheck::Format, "a 32-hex-digit id and short text fields", "oversized fields"));
        }
        Ok(r)
    }

    /// The receipt as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Checks the receipt against what the verifier knows: the attested key,
    /// route and model, and, where it has them, the request it sent and the
    /// body it read. The fields are compared before the signature, so a
    /// receipt for another route or transcript is named for what differs.
    pub fn check(&self, expect: &ReceiptExpectation) -> Result<(), ReceiptFailure> {
        let key = expect.key.ok_or_else(|| {
            fail(ReceiptCheck::Key, "a receipt key in the entry's attested claims", "the entry attested none")
        })?;
        if self.key != key {
            return Err(fail(ReceiptCheck::Key, format!("the attested entry's key {key}"), self.key.to_string()));
        }
        if self.route != expect.route {
            return Err(fail(
                ReceiptCheck::Route,
                format!("the verified route {}", expect.route),
                self.route.to_string(),
            ));
        }
        if self.model != expect.model {
            return Err(fail(
                ReceiptCheck::Model,
                format!("the attested model {}", expect.model),
                self.model.to_string(),
            ));
        }
        if let Some(request) = expect.request {
            if self.request != request {
                return Err(fail(
                    ReceiptCheck::Request,
                    format!("the sealed request sent, {request}"),
                    self.request.to_string(),
                ));
            }
        }
        if let Some(response) = expect.response {
            if self.response != response {
                return Err(fail(
                    ReceiptCheck::Response,
                    format!("the body read, {response}"),
                    self.response.to_string(),
                ));
            }
        }
        if let Some(not_before) = expect.not_before {
            let earliest = not_before.saturating_sub(RECEIPT_SKEW.as_secs());
            if self.time < earliest {
                return Err(fail(
                    ReceiptCheck::Time,
                    format!("at or after {earliest} (the route's verification, less {RECEIPT_SKEW:?})"),
                    self.time.to_string(),
                ));
            }
        }
        let signature = hex::decode(&self.signature)
            .map_err(|e| fail(ReceiptCheck::Signature, "a hex Ed25519 signature", e.to_string()))?;
        UnparsedPublicKey::new(&ED25519, key.0)
            .verify(&self.signed_bytes(), &signature)
            .map_err(|_| fail(ReceiptCheck::Signature, format!("a signature by {key} over every field"), "a bad one"))
    }
}

/// What a verifier expects of a receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiptExpectation {
    /// The receipt key in the entry's verified claims (`None`: it attested none).
    pub key: Option<ReceiptKey>,
    /// The verified route's id.
    pub route: RouteId,
    /// The entry's attested manifest root.
    pub model: ManifestRoot,
    /// SHA-256 of the sealed request sent, when known.
    pub request: Option<Digest32>,
    /// SHA-256 of the body read, when known.
    pub response: Option<Digest32>,
    /// When the route was verified (Unix seconds), when known.
    pub not_before: Option<u64>,
}

impl ReceiptExpectation {
    /// What a receipt for an answer on `route` must carry (the transcript
    /// digests and time left open).
    pub fn of_route(route: &VerifiedRoute) -> Self {
        let claims = route.entry().evidence().claims().cloned().unwrap_or_default();
        Self {
            key: claims.receipt_key,
            // The verified claims encode (they were bound into the report).
            route: route_id(&claims).unwrap_or(Digest32([0; 32])),
            model: route.entry().evidence().claims().and_then(|c| c.manifest_root).unwrap_or(ManifestRoot([0; 32])),
            request: None,
            response: None,
            not_before: None,
        }
    }
}

/// The entry's receipt-signing key; it never leaves the entry.
pub struct ReceiptSigner {
    pair: Ed25519KeyPair,
    public: ReceiptKey,
}

impl fmt::Debug for ReceiptSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ReceiptSigner({})", self.public)
    }
}

/// What the entry knows of an answer when it signs its receipt.
#[derive(Clone, Debug)]
pub struct Answered {
    /// SHA-256 of the sealed request as received.
    pub request: Digest32,
    /// SHA-256 of the body as sealed.
    pub response: Digest32,
    /// The entry's manifest root.
    pub model: ManifestRoot,
    /// The route that served it.
    pub route: RouteId,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// The drafter that ran.
    pub drafter: String,
    /// The shards the session ran on.
    pub shards: String,
}

impl ReceiptSigner {
    /// A fresh key from the system's random source.
    pub fn generate() -> Result<Self, InvalidValue> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng)
            .map_err(|_| InvalidValue::new(ValueKind::ReceiptKey, "the system's random source failed"))?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
            .map_err(|e| InvalidValue::new(ValueKind::ReceiptKey, e.to_string()))?;
        let mut public = [0u8; 32];
        public.copy_from_slice(pair.public_key().as_ref());
        Ok(Self { pair, public: ReceiptKey(public) })
    }

    /// The public key (bound into the entry's claims).
    pub fn public(&self) -> ReceiptKey {
        self.public
    }

    /// Signs the receipt for `answered` at `now`.
    pub fn sign(&self, answered: Answered, now: SystemTime) -> Receipt {
        let mut id = [0u8; 16];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut id);
        let clip = |mut s: String| {
            if s.len() > MAX_RECEIPT_TEXT {
                let mut end = MAX_RECEIPT_TEXT;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s.truncate(end);
            }
            s
        };
        let mut r = Receipt {
            version: RECEIPT_VERSION,
            id: hex::encode(id),
            time: now.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
            request: answered.request,
            response: answered.response,
            model: answered.model,
            route: answered.route,
            prompt_tokens: answered.prompt_tokens,
            completion_tokens: answered.completion_tokens,
            drafter: clip(answered.drafter),
            shards: clip(answered.shards),
            key: self.public,
            signature: String::new(),
        };
        r.signature = hex::encode(self.pair.sign(&r.signed_bytes()).as_ref());
        r
    }
}

/// A saved route document that no longer verifies, as a receipt failure
/// (`route_document`) naming the route check or shard that failed.
pub fn route_document_failure(e: RouteError) -> ReceiptFailure {
    let named = match &e {
        RouteError::Rejected(r) => format!("route check `{}` failed: {e}", r.check),
        _ => e.to_string(),
    };
    fail(ReceiptCheck::RouteDocument, "a route document that verifies against the policy", named)
}

/// A route document as a client verified it, kept so its receipts can be
/// checked later: the document, the nonce the client asked with, and when.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedRoute {
    /// [`SAVED_ROUTE_VERSION`].
    pub version: u32,
    /// The client's nonce.
    pub nonce: Nonce,
    /// When the client verified it (Unix seconds).
    pub verified_at: u64,
    /// The document as the entry sent it.
    pub doc: AttestationDoc,
}

impl SavedRoute {
    /// Verifies the saved document again against `policy`, as of when it
    /// was first verified.
    pub fn verify(&self, policy: &Policy) -> Result<VerifiedRoute, RouteError> {
        let at = UNIX_EPOCH + Duration::from_secs(self.verified_at);
        verify_route(&self.doc, policy, &self.nonce, at)
    }

    /// Verifies the saved route again under `policy` (every check the
    /// client ran, as of when it ran them) and returns it with what its
    /// receipts must carry.
    pub fn expectation(&self, policy: &Policy) -> Result<(VerifiedRoute, ReceiptExpectation), ReceiptFailure> {
        if self.version != SAVED_ROUTE_VERSION {
            return Err(fail(
                ReceiptCheck::RouteDocument,
                format!("a saved route of version {SAVED_ROUTE_VERSION}"),
                self.version.to_string(),
            ));
        }
        let route = self.verify(policy).map_err(route_document_failure)?;
        let expect = ReceiptExpectation { not_before: Some(self.verified_at), ..ReceiptExpectation::of_route(&route) };
        Ok((route, expect))
    }

    /// Checks `receipt` against this saved route under `policy`: the route
    /// document first ([`expectation`](Self::expectation)), then the receipt.
    pub fn check_receipt(&self, receipt: &Receipt, policy: &Policy) -> Result<VerifiedRoute, ReceiptFailure> {
        let (route, expect) = self.expectation(policy)?;
        receipt.check(&expect)?;
        Ok(route)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered() -> Answered {
        Answered {
            request: Digest32([1; 32]),
            response: Digest32([2; 32]),
            model: ManifestRoot([3; 32]),
            route: Digest32([4; 32]),
            prompt_tokens: 12,
            completion_tokens: 7,
            drafter: "none".into(),
            shards: "s1r0:0011223344556677".into(),
        }
    }

    fn expect(signer: &ReceiptSigner) -> ReceiptExpectation {
        ReceiptExpectation {
            key: Some(signer.public()),
            route: Digest32([4; 32]),
            model: ManifestRoot([3; 32]),
            request: Some(Digest32([1; 32])),
            response: Some(Digest32([2; 32])),
            not_before: Some(1_000),
        }
    }

    #[test]
    fn a_signed_receipt_verifies_and_survives_json() {
        let s = ReceiptSigner::generate().unwrap();
        let r = s.sign(answered(), UNIX_EPOCH + Duration::from_secs(2_000));
        r.check(&expect(&s)).unwrap();
        let back = Receipt::from_json(r.to_json().as_bytes()).unwrap();
        assert_eq!(back, r);
        back.check(&expect(&s)).unwrap();
    }

    #[test]
    fn every_field_is_covered_and_the_failed_check_is_named() {
        let s = ReceiptSigner::generate().unwrap();
        let r = s.sign(answered(), UNIX_EPOCH + Duration::from_secs(2_000));
        let named = |edit: &dyn Fn(&mut Receipt)| {
            let mut t = r.clone();
            edit(&mut t);
            t.check(&expect(&s)).unwrap_err().check
        };
        assert_eq!(named(&|t| t.route.0[0] ^= 1), ReceiptCheck::Route);
        assert_eq!(named(&|t| t.model.0[0] ^= 1), ReceiptCheck::Model);
        assert_eq!(named(&|t| t.request.0[31] ^= 1), ReceiptCheck::Request);
        assert_eq!(named(&|t| t.response.0[5] ^= 1), ReceiptCheck::Response);
        assert_eq!(named(&|t| t.time = 1), ReceiptCheck::Time);
        assert_eq!(named(&|t| t.key.0[0] ^= 1), ReceiptCheck::Key);
        assert_eq!(named(&|t| t.time += 1), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.prompt_tokens += 1), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.completion_tokens -= 1), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.drafter.push('x')), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.shards.clear()), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.id = "0".repeat(32)), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.signature.replace_range(0..2, "00")), ReceiptCheck::Signature);
        assert_eq!(named(&|t| t.signature = "zz".into()), ReceiptCheck::Signature);
    }

    #[test]
    fn another_entrys_receipt_or_a_route_without_a_key_fails_on_the_key() {
        let ours = ReceiptSigner::generate().unwrap();
        let theirs = ReceiptSigner::generate().unwrap();
        let r = theirs.sign(answered(), UNIX_EPOCH + Duration::from_secs(2_000));
        assert_eq!(r.check(&expect(&ours)).unwrap_err().check, ReceiptCheck::Key);
        // Claiming our key does not help: the signature is theirs.
        let mut forged = r.clone();
        forged.key = ours.public();
        assert_eq!(forged.check(&expect(&ours)).unwrap_err().check, ReceiptCheck::Signature);
        let none = ReceiptExpectation { key: None, ..expect(&ours) };
        assert_eq!(r.check(&none).unwrap_err().check, ReceiptCheck::Key);
    }

    #[test]
    fn malformed_receipts_are_refused_as_format() {
        let s = ReceiptSigner::generate().unwrap();
        let r = s.sign(answered(), SystemTime::now());
        let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        v["surprise"] = 1.into();
        assert_eq!(Receipt::from_json(v.to_string().as_bytes()).unwrap_err().check, ReceiptCheck::Format);
        let mut v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        v["version"] = 2.into();
        assert_eq!(Receipt::from_json(v.to_string().as_bytes()).unwrap_err().check, ReceiptCheck::Format);
        assert_eq!(Receipt::from_json(&vec![b' '; MAX_RECEIPT_BYTES + 1]).unwrap_err().check, ReceiptCheck::Format);
        assert_eq!(Receipt::from_json(b"{").unwrap_err().check, ReceiptCheck::Format);
    }

    #[test]
    fn the_route_id_ignores_the_nonce_and_relinks_but_not_keys_or_policy() {
        let base = Claims {
            nonce: Some(Nonce::new(vec![1; 32]).unwrap()),
            receipt_key: Some(ReceiptKey([5; 32])),
            route_links: Some(crate::LinksCommitment([6; 32])),
            ..Claims::default()
        };
        let id = route_id(&base).unwrap();
        let other_nonce = Claims { nonce: Some(Nonce::new(vec![2; 32]).unwrap()), ..base.clone() };
        assert_eq!(route_id(&other_nonce).unwrap(), id);
        let relinked = Claims { route_links: Some(crate::LinksCommitment([7; 32])), ..base.clone() };
        assert_eq!(route_id(&relinked).unwrap(), id);
        let rekeyed = Claims { receipt_key: Some(ReceiptKey([8; 32])), ..base.clone() };
        assert_ne!(route_id(&rekeyed).unwrap(), id);
        let other_policy = Claims { peer_policy: Some(crate::PolicyDigest([9; 32])), ..base.clone() };
        assert_ne!(route_id(&other_policy).unwrap(), id);
        let other_shape = Claims { route_shape: Some(crate::RouteDigest([9; 32])), ..base };
        assert_ne!(route_id(&other_shape).unwrap(), id);
    }
}
