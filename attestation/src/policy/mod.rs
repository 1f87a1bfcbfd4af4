//! The appraisal policy: every reference value the verifier compares against.
//!
//! A policy is a TOML file owned by the relying party. Unknown keys are an
//! error (a typo must not silently weaken a check). Example:
//!
//! ```toml
//! products = ["Milan", "Genoa", "Turin"]
//! min_report_version = 2
//! allow_vlek = false
//! require_crl = false
//! allow_debug = false
//! allow_migration_agent = false
//! allow_smt = true
//! vmpl = 0
//! measurements = ["7a1e5c266c0108dbc9bb94fa926951320940915d0aafb42464bd88b579ea158d3e1a0dc39b2c60bd95b9c480cd81841f"]
//! # host_data = "…64 hex…"
//! # id_key_digest = "…96 hex…"
//! allow_simulated = false
//!
//! [min_tcb.Milan]
//! bootloader = 3
//! tee = 0
//! snp = 8
//! microcode = 115
//!
//! # Platform hardening (see `PlatformPolicy`; every key optional).
//! [platform]
//! require_guest_policy = ["single_socket", "rapl_disabled"]  # guest-policy bits the launch must set
//! allow_cxl = false                    # refuse guests that allow CXL-attached memory (the default)
//! min_guest_abi = "1.55"               # lowest ABI the guest required of the firmware
//! require_platform = ["tsme", "alias_check_complete"]  # PLATFORM_INFO bits the host must report
//! refuse_unknown_platform_bits = false # true: PLATFORM_INFO bits this verifier cannot name fail (default: WARN)
//! required_mitigations = [0]           # bit numbers set in both mitigation vectors (report v5+)
//!
//! # NVIDIA GPU evidence (see `GpuPolicy`; every key optional, defaults shown commented).
//! [gpu]
//! required = true                      # a shard without GPU evidence is refused
//! # count = 1                          # GPUs each shard must present
//! min_driver_version = "550.54.14"     # dotted decimal, compared numerically
//! min_vbios_version = "96.00.5E.00.01" # dotted hex, compared numerically
//! require_protected_pcie = false       # protected-PCIe status must be on (0xAA)
//! require_rim = true                   # golden measurements (RIMs) must be supplied and match
//! require_rim_signature = false        # every RIM must be signed (signed RIMs are always verified)
//! require_revocation = false           # current OCSP responses for the device chain (carried or given)
//! require_cc_settings = false          # the collector's CC/DevTools report must be present
//! # root_pem = "-----BEGIN CERTIFICATE-----…"  # replaces the compiled-in NVIDIA Device Identity CA
//! # rim_root_pem = "-----BEGIN CERTIFICATE-----…"  # replaces the compiled-in NVIDIA CoRIM signing root
//! ```

mod gaps;
mod gaps_platforms;
mod gpu;
mod platform;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use self::gaps::PolicyGap;
pub use self::gpu::GpuPolicy;
pub use self::platform::{AbiVersion, GuestPolicyFlag, PlatformFlag, PlatformPolicy};
pub use crate::azure::AzurePolicy;
use crate::claims::{KeyHash, ManifestRoot, Measurement, PolicyDigest};
pub use crate::invalid::PolicyError;
use crate::snp::{report::KNOWN_VERSIONS, Product};
pub use crate::tdx::TdxPolicy;

/// Lowest report version Veil accepts by default. Version 2 reports (no
/// CPUID fields) still come from deployed Milan firmware; the product is then
/// taken from the endorsement chain alone.
pub const DEFAULT_MIN_REPORT_VERSION: u32 = 2;

/// Minimum security patch level per TCB component; absent components are not checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcbMinimum {
    /// FMC (Turin only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fmc: Option<u8>,
    /// PSP boot loader.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<u8>,
    /// PSP OS (TEE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tee: Option<u8>,
    /// SNP firmware.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snp: Option<u8>,
    /// Microcode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub microcode: Option<u8>,
}

/// Hex-encoded 32-byte value in the policy file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostData(pub KeyHash);

/// Hex-encoded 48-byte digest (ID key digest) in the policy file.
pub type IdKeyDigest = Measurement;

/// The appraisal policy for SEV-SNP evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Products whose evidence is acceptable.
    #[serde(default = "all_products")]
    pub products: Vec<Product>,
    /// Lowest acceptable report version.
    #[serde(default = "default_min_version")]
    pub min_report_version: u32,
    /// Highest acceptable report version.
    #[serde(default = "default_max_version")]
    pub max_report_version: u32,
    /// Accept reports signed by a VLEK (cloud-provider key, ASVK chain).
    #[serde(default)]
    pub allow_vlek: bool,
    /// Fail when no CRL accompanies the evidence.
    #[serde(default)]
    pub require_crl: bool,
    /// Accept guests launched with the DEBUG policy bit (never in production).
    #[serde(default)]
    pub allow_debug: bool,
    /// Accept guests that may be associated with a migration agent.
    #[serde(default)]
    pub allow_migration_agent: bool,
    /// Accept platforms with SMT enabled.
    #[serde(default = "yes")]
    pub allow_smt: bool,
    /// Required VMPL of the report.
    #[serde(default)]
    pub vmpl: u32,
    /// TCB minimums per product, compared with `REPORTED_TCB`.
    #[serde(default)]
    pub min_tcb: BTreeMap<Product, TcbMinimum>,
    /// Allowed launch measurements.
    #[serde(default)]
    pub measurements: Vec<Measurement>,
    /// Accept any launch measurement. Must be said in so many words; an
    /// empty allowlist without it rejects everything.
    #[serde(default)]
    pub any_measurement: bool,
    /// Required `HOST_DATA`, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_data: Option<HostData>,
    /// Required `ID_KEY_DIGEST`, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_key_digest: Option<IdKeyDigest>,
    /// Accept evidence from Veil's *simulated* attester. Development only:
    /// simulated evidence proves nothing about hardware.
    #[serde(default)]
    pub allow_simulated: bool,
    /// When non-empty, only these simulated roots (SHA-256 of the ARK's
    /// SubjectPublicKeyInfo) are accepted under `allow_simulated`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub simulated_roots: Vec<KeyHash>,
    /// Allowed models, by manifest root (one root per model, whatever the
    /// layer range a shard serves of it: `veil-shard manifest`). When
    /// non-empty, every shard must claim one of these roots, and every
    /// stage of a route the same one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub manifest_roots: Vec<ManifestRoot>,
    /// Platform hardening: guest-policy bits, `PLATFORM_INFO`, mitigation vectors.
    #[serde(default, skip_serializing_if = "PlatformPolicy::is_default")]
    pub platform: PlatformPolicy,
    /// NVIDIA GPU evidence requirements.
    #[serde(default, skip_serializing_if = "GpuPolicy::is_default")]
    pub gpu: GpuPolicy,
    /// Intel TDX evidence requirements (`veil attest verify --tdx`; routes
    /// do not carry TDX shards yet).
    #[serde(default, skip_serializing_if = "TdxPolicy::is_default")]
    pub tdx: TdxPolicy,
    /// Azure confidential VM requirements (the HCL report's VM
    /// configuration and the vTPM's PCRs; `veil attest verify --azure`).
    #[serde(default, skip_serializing_if = "AzurePolicy::is_default")]
    pub azure: AzurePolicy,
    /// Peer policies accepted by digest (relying party): a route whose
    /// shards enforce one of these on their links is accepted even where it
    /// is not at least as strict as this policy (`veil policy init` pins
    /// what it saw here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub peer_policies: Vec<PolicyDigest>,
    /// The model's layer count the route must cover, from layer 0, when pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_layers: Option<u32>,
    /// Drafters the entry may speculate with, by digest (relying party; the
    /// `drafter` route check). Empty: any drafter the entry commits to.
    /// Greedy output and the sampled distribution never depend on the
    /// drafter; a seeded sampled request's text does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drafters: Vec<crate::claims::DrafterDigest>,
}

/// Domain separator of a policy's canonical encoding.
pub const POLICY_DOMAIN: &[u8] = b"veil/peer-policy/v1\0";

fn all_products() -> Vec<Product> {
    Product::ALL.to_vec()
}
fn default_min_version() -> u32 {
    DEFAULT_MIN_REPORT_VERSION
}
fn default_max_version() -> u32 {
    *KNOWN_VERSIONS.end()
}
fn yes() -> bool {
    true
}

impl Default for Policy {
    /// The strict default: every product, debug and migration agent off,
    /// VMPL 0, no TCB minimums, simulated evidence refused, and an empty
    /// measurement allowlist (which rejects until a measurement is pinned).
    fn default() -> Self {
        Self {
            products: all_products(),
            min_report_version: DEFAULT_MIN_REPORT_VERSION,
            max_report_version: default_max_version(),
            allow_vlek: false,
            require_crl: false,
            allow_debug: false,
            allow_migration_agent: false,
            allow_smt: true,
            vmpl: 0,
            min_tcb: BTreeMap::new(),
            measurements: Vec::new(),
            any_measurement: false,
            host_data: None,
            id_key_digest: None,
            allow_simulated: false,
            simulated_roots: Vec::new(),
            manifest_roots: Vec::new(),
            platform: PlatformPolicy::default(),
            gpu: GpuPolicy::default(),
            tdx: TdxPolicy::default(),
            azure: AzurePolicy::default(),
            peer_policies: Vec::new(),
            model_layers: None,
            drafters: Vec::new(),
        }
    }
}

impl Policy {
    /// Parses and validates a TOML policy.
    pub fn from_toml(text: &str) -> Result<Self, PolicyError> {
        let policy: Self = toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Serialises to TOML.
    pub fn to_toml(&self) -> String {
        // Invariant: every field is TOML-representable.
        toml::to_string_pretty(self).unwrap_or_default()
    }

    /// Checks internal consistency.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.min_report_version > self.max_report_version {
            return Err(PolicyError::Inconsistent(format!(
                "min_report_version {} > max_report_version {}",
                self.min_report_version, self.max_report_version
            )));
        }
        if self.min_report_version < *KNOWN_VERSIONS.start() || self.max_report_version > *KNOWN_VERSIONS.end() {
            return Err(PolicyError::Inconsistent(format!(
                "report versions must lie within {}..={} (the layouts this verifier knows)",
                KNOWN_VERSIONS.start(),
                KNOWN_VERSIONS.end()
            )));
        }
        if self.products.is_empty() {
            return Err(PolicyError::Inconsistent("products is empty: nothing could be accepted".into()));
        }
        if self.any_measurement && !self.measurements.is_empty() {
            return Err(PolicyError::Inconsistent(
                "any_measurement = true makes the measurements allowlist meaningless; choose one".into(),
            ));
        }
        for (product, min) in &self.min_tcb {
            if min.fmc.is_some() && *product != Product::Turin {
                return Err(PolicyError::Inconsistent(format!("{product} has no FMC component")));
            }
        }
        if !self.simulated_roots.is_empty() && !self.allow_simulated {
            return Err(PolicyError::Inconsistent("simulated_roots is set but allow_simulated = false".into()));
        }
        if self.model_layers == Some(0) {
            return Err(PolicyError::Inconsistent("model_layers = 0".into()));
        }
        self.platform.validate()?;
        self.tdx.validate().map_err(|e| e.within("[tdx]"))?;
        self.azure.validate().map_err(|e| e.within("[azure]"))?;
        self.gpu.validate()
    }

    /// The same policy with every list sorted and deduplicated: two files
    /// that accept exactly the same evidence normalise equal.
    pub fn normalized(&self) -> Self {
        fn norm<T: Ord>(v: &mut Vec<T>) {
            v.sort();
            v.dedup();
        }
        let mut p = self.clone();
        norm(&mut p.products);
        norm(&mut p.measurements);
        norm(&mut p.simulated_roots);
        norm(&mut p.peer_policies);
        norm(&mut p.drafters);
        p.platform.normalize();
        norm(&mut p.manifest_roots);
        p
    }

    /// The canonical encoding: `"veil/peer-policy/v1\0" ‖ JSON` of the
    /// normalised policy (fields in declaration order, maps sorted), so the
    /// same policy always encodes — and hashes — the same, whatever its
    /// file's order, comments or spelling of defaults.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = POLICY_DOMAIN.to_vec();
        // Invariant: the policy is plain data (strings, numbers, maps); serialising cannot fail.
        out.extend_from_slice(&serde_json::to_vec(&self.normalized()).unwrap_or_default());
        out
    }

    /// SHA-256 of [`canonical_bytes`](Self::canonical_bytes): what a shard's
    /// claims carry as its peer policy.
    pub fn digest(&self) -> PolicyDigest {
        use sha2::Digest as _;
        PolicyDigest(sha2::Sha256::digest(self.canonical_bytes()).into())
    }

    /// Every setting that leaves this policy weaker than a production
    /// policy should be, with why (`veil policy check` prints them).
    pub fn weaknesses(&self) -> Vec<(&'static str, String)> {
        let mut w: Vec<(&'static str, String)> = Vec::new();
        if self.allow_simulated {
            w.push((
                "allow_simulated",
                if self.simulated_roots.is_empty() {
                    "accepts SIMULATED evidence from any simulated root: proves nothing about hardware".into()
                } else {
                    "accepts SIMULATED evidence (pinned roots): proves nothing about hardware; development only".into()
                },
            ));
        }
        if self.any_measurement {
            w.push(("any_measurement", "any launch measurement passes: any code may run in the CVM".into()));
        }
        if self.allow_debug {
            w.push(("allow_debug", "debug guests pass: the host can read and write guest memory".into()));
        }
        if self.allow_migration_agent {
            w.push(("allow_migration_agent", "a migration agent may export the guest's memory".into()));
        }
        if self.platform.allow_cxl {
            w.push(("platform.allow_cxl", "guests may place memory on CXL devices outside the SoC".into()));
        }
        for p in &self.products {
            match self.min_tcb.get(p) {
                None => w.push(("min_tcb", format!("no TCB minimums for {p}: rolled-back firmware passes"))),
                Some(m) if m.snp.is_none() || m.microcode.is_none() => {
                    w.push(("min_tcb", format!("{p}: no minimum for the SNP firmware or microcode")))
                }
                Some(_) => {}
            }
        }
        if self.products.contains(&Product::Milan) {
            w.push((
                "products",
                "Milan is allowed: its root seed has been extracted in software (arXiv 2605.12990); reports from Milan \
                 can be forged"
                    .into(),
            ));
        }
        if !self.require_crl {
            w.push(("require_crl", "a missing CRL is tolerated: a revoked ASK or VCEK could pass".into()));
        }
        if !self.gpu.required {
            w.push(("gpu.required", "GPUs optional: a shard presenting no GPU evidence passes".into()));
        } else if !self.gpu.require_rim {
            w.push(("gpu.require_rim", "GPU firmware measurements are not compared with NVIDIA's RIMs".into()));
        }
        for t in self.tdx.weakenings() {
            w.push(("tdx", t));
        }
        if self.manifest_roots.is_empty() {
            w.push(("manifest_roots", "no model manifests pinned: any weights the route pins pass".into()));
        }
        if !self.peer_policies.is_empty() {
            w.push((
                "peer_policies",
                format!(
                    "{} peer polic(ies) accepted by digest even where weaker than this one",
                    self.peer_policies.len()
                ),
            ));
        }
        w
    }

    /// Whether this policy can be met where evidence is verified without
    /// collateral fetched by the relying party (the serving path: client SDK,
    /// `veil verify URL`, links between shards): not with an empty
    /// `measurements` list without `any_measurement`, where no report could
    /// pass — said once, clearly. (`gpu.require_revocation` can be met there:
    /// shards carry OCSP responses in their bundles, `--gpu-reference`.)
    pub fn fit_for_serving_path(&self) -> Result<(), PolicyError> {
        if self.measurements.is_empty() && !self.any_measurement {
            return Err(PolicyError::Inconsistent(
                "measurements = [] allows no launch measurement, so every report would be refused: add the \
                 guests' values (`veil measure … --add-to POLICY`)"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Whether a shard with hardware evidence may enforce this policy on its
    /// links: not if it accepts simulated evidence or waives the measurement.
    pub fn fit_for_hardware(&self) -> Result<(), PolicyError> {
        if self.allow_simulated {
            return Err(PolicyError::Inconsistent(
                "allow_simulated = true: a shard attesting with hardware refuses to link to simulated peers".into(),
            ));
        }
        if self.any_measurement {
            return Err(PolicyError::Inconsistent(
                "any_measurement = true: a shard attesting with hardware requires its peers' launch measurements pinned"
                    .into(),
            ));
        }
        Ok(())
    }
}
