//! NVIDIA's reference material for a hardware shard's GPUs, read from files
//! the operator keeps current, and carried in every evidence bundle: the
//! driver and VBIOS RIMs, and OCSP responses for the device certificates.
//!
//! The files are host-written and that is fine: NVIDIA signs RIMs and OCSP
//! responses, and verifiers check those signatures (`require_rim_signature`,
//! the OCSP check), so the host can withhold material but not forge it. What
//! the host can do is let OCSP responses go stale; so that a shard serving for
//! weeks can meet `gpu.require_revocation`, it re-reads the files every
//! `--gpu-reference-refresh` seconds and carries what it finds from the next
//! bundle on. Material that would fail a verifier's limits is refused at
//! start, and on a refresh the previous material stays (with a warning).
//!
//! ```text
//!  operator's job (NVIDIA RIM service, OCSP responder) ─▶ files / directory
//!  veil-shard: load at start (refuse bad) ─▶ CarriedReference ─▶ every bundle
//!              every N s: load again ─▶ replace (keep old on error)
//! ```

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use veil_attestation::attester::gpu::{CarriedReference, GpuReference};
use veil_attestation::evidence::{MAX_CARRIED_OCSP, MAX_CARRIED_RIMS, MAX_CARRIED_RIM_BYTES};

use crate::error::{Error, Result};

/// At most this many entries are looked at in a reference directory.
pub const MAX_DIRECTORY_ENTRIES: usize = 2 * (MAX_CARRIED_RIMS + MAX_CARRIED_OCSP);

/// Where a shard's GPU reference material is read from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReferenceFiles {
    /// RIM files (`--gpu-rim`), in order.
    pub rims: Vec<PathBuf>,
    /// OCSP response files, DER (`--gpu-ocsp`), in order.
    pub ocsp: Vec<PathBuf>,
    /// A directory (`--gpu-reference`, e.g. a mounted ConfigMap): every
    /// `*.xml` or `*.swidtag` in it is a RIM, every `*.der` or `*.ocsp` an
    /// OCSP response, in name order; names starting with `.` are skipped
    /// (Kubernetes' `..data` links), anything else is refused by name.
    pub dir: Option<PathBuf>,
}

impl ReferenceFiles {
    /// Whether no file or directory is named (nothing to carry or refresh).
    pub fn is_empty(&self) -> bool {
        self.rims.is_empty() && self.ocsp.is_empty() && self.dir.is_none()
    }

    /// Reads every named file, and the directory, into one reference.
    pub fn load(&self) -> Result<GpuReference> {
        let mut reference = GpuReference::default();
        for f in &self.rims {
            reference.rims.push(read_bounded(f)?);
        }
        for f in &self.ocsp {
            reference.ocsp.push(read_bounded(f)?);
        }
        if let Some(dir) = &self.dir {
            for (path, kind) in directory(dir)? {
                let bytes = read_bounded(&path)?;
                match kind {
                    Kind::Rim => reference.rims.push(bytes),
                    Kind::Ocsp => reference.ocsp.push(bytes),
                }
            }
        }
        reference.check().map_err(|e| Error::Config(format!("GPU reference material: {e}")))?;
        Ok(reference)
    }

    /// Reads the files again and, when they changed and pass the limits,
    /// carries them from the next bundle on. Returns whether anything changed.
    pub fn refresh(&self, carried: &CarriedReference) -> Result<bool> {
        let reference = self.load()?;
        carried.replace(reference).map_err(|e| Error::Config(format!("GPU reference material: {e}")))
    }

    /// Calls [`Self::refresh`] every `every`, on its own thread, for the life
    /// of the process; failures are logged and the previous material stays.
    pub fn spawn_refresh(self, carried: CarriedReference, every: Duration) -> Result<()> {
        std::thread::Builder::new()
            .name("gpu-reference".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                match self.refresh(&carried) {
                    Ok(true) => {
                        let now = carried.current();
                        tracing::info!(rims = now.rims.len(), ocsp = now.ocsp.len(), "GPU reference material replaced");
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "GPU reference material not refreshed; the previous stays"),
                }
            })
            .map(drop)
            .map_err(Error::io("starting the GPU reference refresh"))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Rim,
    Ocsp,
}

/// The directory's reference files, in name order.
fn directory(dir: &Path) -> Result<Vec<(PathBuf, Kind)>> {
    let what = |e: std::io::Error| Error::Config(format!("--gpu-reference {}: {e}", dir.display()));
    let mut found = Vec::new();
    for (seen, entry) in std::fs::read_dir(dir).map_err(what)?.enumerate() {
        if seen >= MAX_DIRECTORY_ENTRIES {
            return Err(Error::Config(format!(
                "--gpu-reference {}: more than {MAX_DIRECTORY_ENTRIES} entries",
                dir.display()
            )));
        }
        let path = entry.map_err(what)?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if name.starts_with('.') {
            continue;
        }
        let kind = match path.extension().and_then(|e| e.to_str()) {
            Some("xml" | "swidtag") => Kind::Rim,
            Some("der" | "ocsp") => Kind::Ocsp,
            _ => {
                return Err(Error::Config(format!(
                    "--gpu-reference {}: {name:?} is neither a RIM (.xml, .swidtag) nor an OCSP response (.der, .ocsp)",
                    dir.display()
                )))
            }
        };
        found.push((path, kind));
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// Reads `path`, refusing more than the largest carried item by name (the
/// bundle limits then say which field) without reading a huge file whole.
fn read_bounded(path: &Path) -> Result<Vec<u8>> {
    let what = |e: std::io::Error| Error::Config(format!("{}: {e}", path.display()));
    let mut bytes = Vec::new();
    let limit = MAX_CARRIED_RIM_BYTES as u64 + 1;
    std::fs::File::open(path).map_err(what)?.take(limit).read_to_end(&mut bytes).map_err(what)?;
    if bytes.len() as u64 == limit {
        return Err(Error::Config(format!("{}: larger than {MAX_CARRIED_RIM_BYTES} bytes", path.display())));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;
    use veil_attestation::attester::gpu::simulated::{SimulatedGpu, SimulatedGpuConfig};
    use veil_attestation::attester::gpu::{CompositeAttester, GpuSource};
    use veil_attestation::simulated::{SimulatedAttester, SimulatedConfig};
    use veil_attestation::{Attester as _, Claims};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("veil-gpu-reference-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn shard(gpu: &SimulatedGpu) -> CompositeAttester {
        let root = SimulatedAttester::from_seed(
            b"gpu reference root",
            SimulatedConfig::new(veil_attestation::snp::Product::Genoa, b"gpu reference"),
        )
        .unwrap();
        CompositeAttester::new(Box::new(root), GpuSource::Simulated(vec![gpu.clone()])).unwrap()
    }

    /// A shard serving for longer than its OCSP responses last: the operator
    /// writes new responses into the directory (as a ConfigMap update does)
    /// and the next bundle carries them, without a restart.
    #[test]
    fn fresh_ocsp_responses_written_by_the_operator_reach_the_next_bundle() {
        let gpu = SimulatedGpu::from_seed(b"gpu reference", SimulatedGpuConfig::default()).unwrap();
        let dir = scratch("fresh");
        let now = SystemTime::now();
        let day = Duration::from_secs(86_400);
        let write = |responses: &[Vec<u8>]| {
            for (i, r) in responses.iter().enumerate() {
                std::fs::write(dir.join(format!("ocsp-{i}.der")), r).unwrap();
            }
        };
        let old = gpu.ocsp_responses(None, now - 3 * day, Some(now - day)).unwrap();
        write(&old);
        std::fs::write(dir.join("driver.xml"), gpu.rim_xml(true)).unwrap();
        std::fs::create_dir(dir.join("..data")).unwrap();
        let files = ReferenceFiles { dir: Some(dir.clone()), ..Default::default() };
        let att = shard(&gpu).carrying(files.load().unwrap()).unwrap();
        let claims = Claims { software_version: "test".into(), ..Claims::default() };
        let before = att.evidence(&claims).unwrap();
        assert_eq!((before.gpu_ocsp.clone(), before.gpu_rims.len()), (old.clone(), 1));

        let fresh = gpu.ocsp_responses(None, now - day, Some(now + day)).unwrap();
        write(&fresh);
        assert!(files.refresh(&att.carried()).unwrap());
        assert_eq!(att.evidence(&claims).unwrap().gpu_ocsp, fresh);
        assert!(!files.refresh(&att.carried()).unwrap(), "unchanged files change nothing");

        // A bad file on a refresh is refused by name and the fresh material stays.
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        let err = files.refresh(&att.carried()).unwrap_err().to_string();
        assert!(err.contains("notes.txt"), "{err}");
        std::fs::remove_file(dir.join("notes.txt")).unwrap();
        std::fs::write(dir.join("vbios.xml"), "<not a rim/>").unwrap();
        let err = files.refresh(&att.carried()).unwrap_err().to_string();
        assert!(err.contains("gpu_rims") || err.contains("RIM"), "{err}");
        assert_eq!(att.evidence(&claims).unwrap().gpu_ocsp, fresh);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn oversized_or_missing_files_are_refused_by_name() {
        let dir = scratch("bounds");
        let big = dir.join("huge.der");
        std::fs::write(&big, vec![0u8; MAX_CARRIED_RIM_BYTES + 1]).unwrap();
        let err = ReferenceFiles { ocsp: vec![big], ..Default::default() }.load().unwrap_err().to_string();
        assert!(err.contains("huge.der") && err.contains("larger than"), "{err}");
        let err =
            ReferenceFiles { rims: vec![dir.join("absent.xml")], ..Default::default() }.load().unwrap_err().to_string();
        assert!(err.contains("absent.xml"), "{err}");
        // An OCSP response over the bundle's per-item limit: the field is named.
        let ocsp = dir.join("ocsp.der");
        std::fs::write(&ocsp, vec![0u8; veil_attestation::evidence::MAX_OCSP_BYTES + 1]).unwrap();
        let err = ReferenceFiles { ocsp: vec![ocsp], ..Default::default() }.load().unwrap_err().to_string();
        assert!(err.contains("gpu_ocsp"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
