//! Preparing a route for a local (simulated-TEE) cluster: a simulated root
//! and development policy when missing, and every stage's manifest root
//! computed from the model where the file leaves it out. What the operator
//! runs before starting shards; shards themselves only accept a fully
//! pinned route.

use std::path::Path;

use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};

use super::route::Route;
use crate::error::{Error, Result};
use crate::model::GgufFile;

/// Fills in what a development route may leave out; writes the simulated
/// root and policy into their configured paths if they do not exist yet.
pub fn prepare(mut route: Route) -> Result<Route> {
    if let Some(dir) = &route.simulated_root {
        if !dir.join("ark.key.pem").exists() {
            std::fs::create_dir_all(dir).map_err(Error::io(format!("creating {}", dir.display())))?;
            let seed = veil_attestation::Nonce::random().as_bytes().to_vec();
            let sim = SimulatedAttester::from_seed(
                &seed,
                SimulatedConfig::new(veil_attestation::snp::Product::Genoa, &seed),
            )?;
            sim.save(dir)?;
            tracing::warn!(dir = %dir.display(), "created a SIMULATED attestation root (development only)");
        }
        if !route.policy.exists() {
            let sim = SimulatedAttester::load(dir)?;
            let mut policy = sim.dev_policy()?;
            if route.simulated_gpus > 0 {
                // Every shard must present its (simulated) GPUs, bound to its claims.
                policy.gpu.required = true;
                policy.gpu.count = Some(route.simulated_gpus);
            }
            let text = format!(
                "# DEVELOPMENT POLICY: accepts evidence from the SIMULATED root in this directory only.\n\
                 # Simulated evidence proves nothing about hardware. Never use this policy in production.\n{}",
                policy.to_toml()
            );
            write_new(&route.policy, &text).map_err(Error::io(format!("writing {}", route.policy.display())))?;
            tracing::warn!(policy = %route.policy.display(), "wrote a development policy accepting the simulated root");
        }
    }
    if route.stages.iter().any(|s| s.manifest_root.is_none()) {
        // One root per model, whatever the stage: hashed once here.
        let root = veil_attestation::ManifestRoot(GgufFile::open(&route.model)?.model_manifest()?.root());
        for stage in &mut route.stages {
            stage.manifest_root.get_or_insert(root);
        }
    }
    Ok(route)
}

fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)
}
