//! The hybrid post-quantum TLS key exchange X25519MLKEM768
//! (draft-ietf-tls-ecdhe-mlkem, code point 0x11EC) for rustls' ring
//! provider, which offers only classical groups.
//!
//! Shares, ML-KEM first:
//! - client: ML-KEM-768 encapsulation key (1184 bytes) ‖ X25519 public key (32);
//! - server: ML-KEM-768 ciphertext (1088 bytes) ‖ X25519 public key (32);
//! - shared secret: ML-KEM shared key (32) ‖ X25519 shared secret (32).
//!
//! ML-KEM is RustCrypto's `ml-kem` (FIPS 203); X25519 is ring's, through
//! rustls. A recorded session stays secret unless both are broken. (rustls
//! ships this group only with its aws-lc-rs provider; Veil's TLS runs on
//! ring, which also builds for wasm32.)
//!
//! [`link_provider`] offers this group alone: RA-TLS links between shards
//! refuse a peer that cannot negotiate it. [`client_provider`] and
//! [`server_provider`] prefer it and fall back to X25519 and the NIST curves,
//! for the client's TLS to the relay, which may be any server.

#![forbid(unsafe_code)]

use std::sync::Arc;

use ml_kem::array::Array;
use ml_kem::{DecapsulationKey768, EncapsulationKey768, KeyExport, MlKem768, Seed};
use rustls::crypto::{ActiveKeyExchange, CompletedKeyExchange, CryptoProvider, SharedSecret, SupportedKxGroup};
use rustls::{Error, NamedGroup, PeerMisbehaved};

/// ML-KEM-768 encapsulation key length.
const EK_LEN: usize = 1184;
/// ML-KEM-768 ciphertext length.
const CT_LEN: usize = 1088;
/// X25519 public key length.
const X25519_LEN: usize = 32;

/// X25519MLKEM768.
pub static X25519MLKEM768: &dyn SupportedKxGroup = &Hybrid;

fn bad_share() -> Error {
    Error::PeerMisbehaved(PeerMisbehaved::InvalidKeyShare)
}

fn random<const N: usize>() -> Result<[u8; N], Error> {
    let mut out = [0u8; N];
    rand_core::RngCore::try_fill_bytes(&mut rand_core::OsRng, &mut out).map_err(|_| rustls::crypto::GetRandomFailed)?;
    Ok(out)
}

#[derive(Debug)]
struct Hybrid;

/// The client's half in flight: its ML-KEM decapsulation key and X25519 exchange.
struct Active {
    dk: DecapsulationKey768,
    x25519: Box<dyn ActiveKeyExchange>,
    share: Vec<u8>,
}

impl SupportedKxGroup for Hybrid {
    fn start(&self) -> Result<Box<dyn ActiveKeyExchange>, Error> {
        let seed: Seed = Array::from(random::<64>()?);
        let dk = DecapsulationKey768::from_seed(seed);
        let x25519 = rustls::crypto::ring::kx_group::X25519.start()?;
        let mut share = Vec::with_capacity(EK_LEN + X25519_LEN);
        share.extend_from_slice(&dk.encapsulation_key().to_bytes());
        share.extend_from_slice(x25519.pub_key());
        Ok(Box::new(Active { dk, x25519, share }))
    }

    /// The server's half, in one step: encapsulate to the client's key and
    /// complete X25519 against its public key.
    fn start_and_complete(&self, client_share: &[u8]) -> Result<CompletedKeyExchange, Error> {
        if client_share.len() != EK_LEN + X25519_LEN {
            return Err(bad_share());
        }
        let (ek, x_pub) = client_share.split_at(EK_LEN);
        let ek: &ml_kem::Key<EncapsulationKey768> = ek.try_into().map_err(|_| bad_share())?;
        let ek = EncapsulationKey768::new(ek).map_err(|_| bad_share())?;
        let (ct, pq_secret) = ek.encapsulate_deterministic(&Array::from(random::<32>()?));
        let classical = rustls::crypto::ring::kx_group::X25519.start_and_complete(x_pub)?;
        let mut pub_key = Vec::with_capacity(CT_LEN + X25519_LEN);
        pub_key.extend_from_slice(&ct);
        pub_key.extend_from_slice(&classical.pub_key);
        let mut secret = Vec::with_capacity(64);
        secret.extend_from_slice(&pq_secret);
        secret.extend_from_slice(classical.secret.secret_bytes());
        Ok(CompletedKeyExchange { group: NamedGroup::X25519MLKEM768, pub_key, secret: SharedSecret::from(secret) })
    }

    fn name(&self) -> NamedGroup {
        NamedGroup::X25519MLKEM768
    }

    fn usable_for_version(&self, version: rustls::ProtocolVersion) -> bool {
        version == rustls::ProtocolVersion::TLSv1_3
    }
}

impl ActiveKeyExchange for Active {
    fn complete(self: Box<Self>, server_share: &[u8]) -> Result<SharedSecret, Error> {
        if server_share.len() != CT_LEN + X25519_LEN {
            return Err(bad_share());
        }
        let (ct, x_pub) = server_share.split_at(CT_LEN);
        let ct: &ml_kem::Ciphertext<MlKem768> = ct.try_into().map_err(|_| bad_share())?;
        let pq_secret = ml_kem::Decapsulate::decapsulate(&self.dk, ct);
        let classical = self.x25519.complete(x_pub)?;
        let mut secret = Vec::with_capacity(64);
        secret.extend_from_slice(&pq_secret);
        secret.extend_from_slice(classical.secret_bytes());
        Ok(SharedSecret::from(secret))
    }

    /// The X25519 half on its own, for a server that picks plain X25519
    /// (one key share offered for both groups).
    fn hybrid_component(&self) -> Option<(NamedGroup, &[u8])> {
        Some((NamedGroup::X25519, self.x25519.pub_key()))
    }

    fn complete_hybrid_component(self: Box<Self>, peer: &[u8]) -> Result<SharedSecret, Error> {
        self.x25519.complete(peer)
    }

    fn pub_key(&self) -> &[u8] {
        &self.share
    }

    fn group(&self) -> NamedGroup {
        NamedGroup::X25519MLKEM768
    }
}

/// Links between shards: TLS 1.3 with X25519MLKEM768 only.
pub fn link_provider() -> Arc<CryptoProvider> {
    Arc::new(CryptoProvider { kx_groups: vec![X25519MLKEM768], ..rustls::crypto::ring::default_provider() })
}

/// The client's TLS to the relay, and the relay's: X25519MLKEM768 first,
/// then ring's classical groups for a peer without it.
pub fn client_provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.kx_groups.insert(0, X25519MLKEM768);
    Arc::new(provider)
}

/// The relay's TLS server: the same preference as [`client_provider`].
pub fn server_provider() -> Arc<CryptoProvider> {
    client_provider()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_halves_agree_and_a_wrong_share_is_refused() {
        let client = X25519MLKEM768.start().unwrap();
        assert_eq!(client.pub_key().len(), EK_LEN + X25519_LEN);
        let server = X25519MLKEM768.start_and_complete(client.pub_key()).unwrap();
        assert_eq!(server.pub_key.len(), CT_LEN + X25519_LEN);
        let server_secret = server.secret.secret_bytes().to_vec();
        assert_eq!(server_secret.len(), 64);
        let client_secret = client.complete(&server.pub_key).unwrap();
        assert_eq!(client_secret.secret_bytes(), &server_secret[..]);

        // Another ciphertext: ML-KEM's implicit rejection gives another
        // secret, never the same one.
        let client = X25519MLKEM768.start().unwrap();
        let mut server = X25519MLKEM768.start_and_complete(client.pub_key()).unwrap();
        let good = server.secret.secret_bytes().to_vec();
        server.pub_key[10] ^= 1;
        assert_ne!(client.complete(&server.pub_key).unwrap().secret_bytes(), &good[..]);

        let client = X25519MLKEM768.start().unwrap();
        assert!(X25519MLKEM768.start_and_complete(&client.pub_key()[..100]).is_err());
        assert!(client.complete(&[0; 32]).is_err());
    }
}
