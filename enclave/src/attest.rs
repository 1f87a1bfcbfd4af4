//! Evidence for this shard: choose the attester, build the claims, emit a bundle.

use std::path::PathBuf;

use veil_attestation::{Attester, Claims, Error, EvidenceBundle, LayerRange, Nonce, SimulatedAttester};

/// Where evidence comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Veil's simulated root in a directory made by `veil attest sim-init`.
    Simulated(PathBuf),
    /// The SEV-SNP guest device (requires the `hw` feature and an SNP guest).
    Hardware {
        /// VMPL to request the report at.
        vmpl: u32,
    },
}

/// Loads the attester for `source`.
pub fn attester(source: &Source) -> Result<Box<dyn Attester>, Error> {
    match source {
        Source::Simulated(dir) => {
            tracing::warn!("using the SIMULATED attester: evidence proves nothing about hardware");
            Ok(Box::new(SimulatedAttester::load(dir)?))
        }
        #[cfg(feature = "hw")]
        Source::Hardware { vmpl } => Ok(Box::new(veil_attestation::hw::HardwareAttester::new(*vmpl))),
        #[cfg(not(feature = "hw"))]
        Source::Hardware { .. } => Err(Error::ApiMisuse("this veil-shard was built without the `hw` feature".into())),
    }
}

/// Claims of a shard that has not loaded a model yet.
pub fn claims(layers: Option<LayerRange>, nonce: Option<Nonce>) -> Claims {
    Claims {
        layer_range: layers,
        nonce,
        software_version: format!("veil-shard {}", env!("CARGO_PKG_VERSION")),
        ..Claims::default()
    }
}

/// Evidence for `claims` from `source`.
pub fn evidence(source: &Source, claims: &Claims) -> Result<EvidenceBundle, Error> {
    attester(source)?.evidence(claims)
}
