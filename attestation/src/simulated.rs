//! The simulated attester: a software AMD-shaped key hierarchy
//! (ARK → ASK → VCEK, ECDSA P-384) that signs reports in the exact SNP
//! layout, so every verifier path runs on machines without SEV-SNP.
//!
//! Every certificate it issues carries [`SIMULATED_ORG`] as its organisation,
//! and the verifier accepts its root only under `allow_simulated = true`,
//! with a warning in every check table. Simulated evidence proves nothing.

use std::path::Path;
use std::time::{Duration, SystemTime};

use p384::ecdsa::signature::Signer;
use p384::pkcs8::{DecodePrivateKey, EncodePrivateKey, LineEnding};
use rcgen::{CertificateParams, CustomExtension, DnType, IsCa, Issuer, KeyPair, SerialNumber};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha384, Sha512};

use crate::claims::{Claims, Measurement, ReportData};
use crate::error::Error;
use crate::evidence::EvidenceBundle;
use crate::snp::report::field;
use crate::snp::{GuestPolicy, PlatformInfo, Product, RawTcb, Tcb, REPORT_LEN, SIGNED_LEN};
use crate::x509::ParsedCert;

/// Organisation name of every simulated certificate; the verifier's marker.
pub const SIMULATED_ORG: &str = "Veil SIMULATED attestation - NOT AMD hardware";

/// Whether a certificate was issued by the simulated hierarchy.
pub fn is_simulated_cert(cert: &ParsedCert) -> bool {
    cert.subject_string().contains(SIMULATED_ORG)
}

/// What the simulated platform and guest look like.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatedConfig {
    /// Product the hierarchy imitates.
    pub product: Product,
    /// Report version written (3 carries CPUID fields).
    pub report_version: u32,
    /// Guest policy bits.
    pub guest_policy: u64,
    /// VMPL the report claims.
    pub vmpl: u32,
    /// Launch measurement (by default SHA-384 of a fixed label: no real launch happened).
    pub measurement: Measurement,
    /// HOST_DATA.
    #[serde(with = "hex_array")]
    pub host_data: [u8; 32],
    /// Platform info bits.
    pub platform_info: u64,
    /// TCB the VCEK is issued for and the report claims.
    pub tcb: Tcb,
    /// Chip id (Turin: 8 significant bytes).
    #[serde(with = "hex_vec")]
    pub chip_id: Vec<u8>,
    /// Guest SVN.
    pub guest_svn: u32,
}

impl SimulatedConfig {
    /// A plausible production-like guest on `product`, chip id from `seed`.
    pub fn new(product: Product, seed: &[u8]) -> Self {
        let chip = Sha512::digest([b"veil/sim/chip-id\0".as_slice(), seed].concat());
        let chip_id = match product {
            Product::Turin => chip[..8].to_vec(),
            _ => chip.to_vec(),
        };
        let tcb = Tcb { fmc: (product == Product::Turin).then_some(1), bootloader: 9, tee: 0, snp: 23, microcode: 72 };
        Self {
            product,
            report_version: 3,
            guest_policy: GuestPolicy::SMT | GuestPolicy::RESERVED_MUST_BE_ONE,
            vmpl: 0,
            measurement: default_measurement(),
            host_data: [0; 32],
            platform_info: PlatformInfo::SMT_EN | PlatformInfo::TSME_EN,
            tcb,
            chip_id,
            guest_svn: 0,
        }
    }
}

/// The measurement simulated guests report unless configured otherwise.
pub fn default_measurement() -> Measurement {
    Measurement(Sha384::digest(b"veil simulated launch: no real measurement").into())
}

mod hex_array {
    pub(super) fn serialize<S: serde::Serializer>(v: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        hex::decode(s)
            .map_err(serde::de::Error::custom)?
            .try_into()
            .map_err(|_| serde::de::Error::custom("expected 32 bytes"))
    }
}

mod hex_vec {
    pub(super) fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(v))
    }
    pub(super) fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        hex::decode(s).map_err(serde::de::Error::custom)
    }
}

/// One key of the hierarchy.
#[derive(Clone)]
struct SimKey {
    secret: p384::SecretKey,
}

impl std::fmt::Debug for SimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimKey(<redacted>)")
    }
}

impl SimKey {
    fn derive(seed: &[u8], label: &str) -> Self {
        let mut counter = 0u32;
        loop {
            let h = Sha512::new()
                .chain_update(b"veil/sim/key\0")
                .chain_update(label.as_bytes())
                .chain_update(counter.to_be_bytes())
                .chain_update(seed)
                .finalize();
            if let Ok(secret) = p384::SecretKey::from_slice(&h[..48]) {
                return Self { secret };
            }
            counter += 1;
        }
    }

    fn rcgen(&self) -> Result<KeyPair, Error> {
        let der = self.secret.to_pkcs8_der().map_err(|e| Error::ApiMisuse(e.to_string()))?;
        let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(der.as_bytes());
        KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ECDSA_P384_SHA384).map_err(rcgen_err)
    }

    fn pem(&self) -> Result<String, Error> {
        Ok(self.secret.to_pkcs8_pem(LineEnding::LF).map_err(|e| Error::ApiMisuse(e.to_string()))?.to_string())
    }
}

fn rcgen_err(e: rcgen::Error) -> Error {
    Error::ApiMisuse(format!("certificate generation: {e}"))
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(i64::MAX))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn der_integer(v: u8) -> Vec<u8> {
    if v < 0x80 {
        vec![0x02, 0x01, v]
    } else {
        vec![0x02, 0x02, 0x00, v]
    }
}

fn der_ia5(s: &str) -> Vec<u8> {
    let mut out = vec![0x16, s.len() as u8];
    out.extend_from_slice(s.as_bytes());
    out
}

/// Validity the simulated hierarchy's certificates get by default.
pub fn default_validity() -> (SystemTime, SystemTime) {
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200); // 2024-01-01
    let end = SystemTime::UNIX_EPOCH + Duration::from_secs(2_650_838_400); // 2054-01-01
    (start, end)
}

/// Parameters of a VCEK the simulated ASK issues (tests vary them).
#[derive(Clone, Debug)]
pub struct VcekSpec {
    /// `hwID` to certify.
    pub chip_id: Vec<u8>,
    /// TCB to certify.
    pub tcb: Tcb,
    /// `notBefore`, `notAfter`.
    pub validity: (SystemTime, SystemTime),
    /// `productName` to write.
    pub product_name: String,
}

/// The simulated hierarchy plus one simulated chip.
#[derive(Clone, Debug)]
pub struct SimulatedAttester {
    config: SimulatedConfig,
    ark_key: SimKey,
    ask_key: SimKey,
    vcek_key: SimKey,
    ark_der: Vec<u8>,
    ask_der: Vec<u8>,
    vcek_der: Vec<u8>,
}

impl SimulatedAttester {
    /// Generates a hierarchy with keys derived from `seed` (use fresh random
    /// bytes for a real simulated deployment; a fixed seed for tests).
    pub fn from_seed(seed: &[u8], config: SimulatedConfig) -> Result<Self, Error> {
        let ark_key = SimKey::derive(seed, "ark");
        let ask_key = SimKey::derive(seed, "ask");
        let vcek_key = SimKey::derive(seed, "vcek");
        let mut sim = Self { config, ark_key, ask_key, vcek_key, ark_der: vec![], ask_der: vec![], vcek_der: vec![] };
        let (ark, ask) = sim.issue_roots()?;
        sim.ark_der = ark;
        sim.ask_der = ask;
        let spec = sim.default_vcek_spec();
        sim.vcek_der = sim.issue_vcek(&spec, None)?;
        Ok(sim)
    }

    /// Generates a hierarchy with fresh random keys.
    pub fn generate(config: SimulatedConfig) -> Result<Self, Error> {
        let mut seed = [0u8; 32];
        rand_core::RngCore::fill_bytes(&mut rand_core::OsRng, &mut seed);
        Self::from_seed(&seed, config)
    }

    fn product(&self) -> Product {
        self.config.product
    }

    fn ca_params(&self, cn: &str, serial: u8) -> CertificateParams {
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationalUnitName, "Engineering");
        p.distinguished_name.push(DnType::OrganizationName, SIMULATED_ORG);
        p.distinguished_name.push(DnType::CommonName, cn);
        p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.serial_number = Some(SerialNumber::from_slice(&[serial]));
        let (nb, na) = default_validity();
        p.not_before = offset(nb);
        p.not_after = offset(na);
        p
    }

    fn ark_params(&self) -> CertificateParams {
        self.ca_params(&format!("ARK-{}", self.product()), 1)
    }

    fn ask_params(&self) -> CertificateParams {
        self.ca_params(&format!("SEV-{}", self.product()), 2)
    }

    fn issue_roots(&self) -> Result<(Vec<u8>, Vec<u8>), Error> {
        let ark_kp = self.ark_key.rcgen()?;
        let ark = self.ark_params().self_signed(&ark_kp).map_err(rcgen_err)?;
        let ask_kp = self.ask_key.rcgen()?;
        let issuer = Issuer::new(self.ark_params(), &ark_kp);
        let ask = self.ask_params().signed_by(&ask_kp, &issuer).map_err(rcgen_err)?;
        Ok((ark.der().to_vec(), ask.der().to_vec()))
    }

    /// The VCEK spec matching this attester's configuration.
    pub fn default_vcek_spec(&self) -> VcekSpec {
        VcekSpec {
            chip_id: self.config.chip_id.clone(),
            tcb: self.config.tcb,
            validity: default_validity(),
            product_name: match self.product() {
                Product::Milan => "Milan-B0".into(),
                Product::Genoa => "Genoa-B1".into(),
                Product::Turin => "Turin-C1".into(),
            },
        }
    }

    /// Issues a VCEK under the simulated ASK. `key` defaults to this chip's
    /// VCEK key; tests pass another seed to model a different chip.
    pub fn issue_vcek(&self, spec: &VcekSpec, key_seed: Option<&[u8]>) -> Result<Vec<u8>, Error> {
        let key = match key_seed {
            Some(seed) => SimKey::derive(seed, "vcek"),
            None => self.vcek_key.clone(),
        };
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationalUnitName, "Engineering");
        p.distinguished_name.push(DnType::OrganizationName, SIMULATED_ORG);
        p.distinguished_name.push(DnType::CommonName, "SEV-VCEK");
        p.serial_number = Some(SerialNumber::from_slice(&[0]));
        p.not_before = offset(spec.validity.0);
        p.not_after = offset(spec.validity.1);
        let amd = |last: u64| vec![1, 3, 6, 1, 4, 1, 3704, 1, last];
        let spl = |n: u64| vec![1, 3, 6, 1, 4, 1, 3704, 1, 3, n];
        let mut ext = vec![
            CustomExtension::from_oid_content(&amd(1), der_integer(0)),
            CustomExtension::from_oid_content(&amd(2), der_ia5(&spec.product_name)),
            CustomExtension::from_oid_content(&spl(1), der_integer(spec.tcb.bootloader)),
            CustomExtension::from_oid_content(&spl(2), der_integer(spec.tcb.tee)),
            CustomExtension::from_oid_content(&spl(3), der_integer(spec.tcb.snp)),
            CustomExtension::from_oid_content(&spl(8), der_integer(spec.tcb.microcode)),
            CustomExtension::from_oid_content(&amd(4), spec.chip_id.clone()),
        ];
        if let Some(fmc) = spec.tcb.fmc {
            ext.push(CustomExtension::from_oid_content(&spl(9), der_integer(fmc)));
        }
        p.custom_extensions = ext;
        let ask_kp = self.ask_key.rcgen()?;
        let issuer = Issuer::new(self.ask_params(), &ask_kp);
        let vcek = p.signed_by(&key.rcgen()?, &issuer).map_err(rcgen_err)?;
        Ok(vcek.der().to_vec())
    }

    /// Issues a CRL signed by the simulated ARK revoking `serials`.
    pub fn issue_crl(
        &self,
        serials: &[&[u8]],
        this_update: SystemTime,
        next_update: SystemTime,
    ) -> Result<Vec<u8>, Error> {
        let params = rcgen::CertificateRevocationListParams {
            this_update: offset(this_update),
            next_update: offset(next_update),
            crl_number: SerialNumber::from_slice(&[1]),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|s| rcgen::RevokedCertParams {
                    serial_number: SerialNumber::from_slice(s),
                    revocation_time: offset(this_update),
                    reason_code: None,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        let ark_kp = self.ark_key.rcgen()?;
        let issuer = Issuer::new(self.ark_params(), &ark_kp);
        Ok(params.signed_by(&issuer).map_err(rcgen_err)?.der().to_vec())
    }

    /// The configuration.
    pub fn config(&self) -> &SimulatedConfig {
        &self.config
    }

    /// A development policy accepting this simulated root only (pinned by
    /// its key) and this attester's measurement. Never for production.
    pub fn dev_policy(&self) -> Result<crate::Policy, Error> {
        let ark = crate::x509::ParsedCert::from_der(self.ark_der())
            .map_err(|e| Error::ApiMisuse(format!("simulated ARK: {e}")))?;
        // The product and TCB this root signs: what `veil policy init`
        // pins from the same evidence, so a client's trust-on-first-use
        // policy is no stricter than the shards' own (no policy gaps).
        let (c, t) = (self.config(), self.config().tcb);
        let min = crate::policy::TcbMinimum {
            fmc: t.fmc,
            bootloader: Some(t.bootloader),
            tee: Some(t.tee),
            snp: Some(t.snp),
            microcode: Some(t.microcode),
        };
        Ok(crate::Policy {
            allow_simulated: true,
            simulated_roots: vec![crate::KeyHash(ark.spki_sha256())],
            measurements: vec![c.measurement],
            products: vec![c.product],
            min_tcb: [(c.product, min)].into_iter().collect(),
            ..crate::Policy::default()
        })
    }

    /// [`dev_policy`](Self::dev_policy) as TOML with a warning header.
    pub fn dev_policy_toml(&self) -> Result<String, Error> {
        Ok(format!(
            "# DEVELOPMENT POLICY: accepts evidence from the SIMULATED root in this directory only.\n\
             # Simulated evidence proves nothing about hardware. Never use this policy in production.\n{}",
            self.dev_policy()?.to_toml()
        ))
    }

    /// The simulated ARK (its key fingerprint can be pinned in a policy).
    pub fn ark_der(&self) -> &[u8] {
        &self.ark_der
    }

    /// The simulated ASK.
    pub fn ask_der(&self) -> &[u8] {
        &self.ask_der
    }

    /// This chip's VCEK.
    pub fn vcek_der(&self) -> &[u8] {
        &self.vcek_der
    }

    /// An unsigned report with every field from the configuration.
    pub fn unsigned_report(&self, report_data: &ReportData) -> [u8; REPORT_LEN] {
        let c = &self.config;
        let mut raw = [0u8; REPORT_LEN];
        let mut put = |at: usize, bytes: &[u8]| raw[at..at + bytes.len()].copy_from_slice(bytes);
        let tcb = RawTcb::encode(c.tcb, c.product).0.to_le_bytes();
        put(field::VERSION, &c.report_version.to_le_bytes());
        put(field::GUEST_SVN, &c.guest_svn.to_le_bytes());
        put(field::POLICY, &c.guest_policy.to_le_bytes());
        put(field::VMPL, &c.vmpl.to_le_bytes());
        put(field::SIGNATURE_ALGO, &crate::snp::report::SIG_ALGO_ECDSA_P384_SHA384.to_le_bytes());
        put(field::CURRENT_TCB, &tcb);
        put(field::PLATFORM_INFO, &c.platform_info.to_le_bytes());
        put(field::KEY_INFO, &0u32.to_le_bytes()); // signed by the VCEK
        put(field::REPORT_DATA, &report_data.0);
        put(field::MEASUREMENT, &c.measurement.0);
        put(field::HOST_DATA, &c.host_data);
        put(field::REPORTED_TCB, &tcb);
        if c.report_version >= 3 {
            let cpuid = c.product.canonical_cpuid();
            put(field::CPUID_FAM_ID, &[cpuid.family, cpuid.model, cpuid.stepping]);
        }
        put(field::CHIP_ID, &c.chip_id);
        put(field::COMMITTED_TCB, &tcb);
        put(field::CURRENT_VERSION, &[40, 55, 1]);
        put(field::COMMITTED_VERSION, &[40, 55, 1]);
        put(field::LAUNCH_TCB, &tcb);
        raw
    }

    /// Signs `raw[0..0x2A0)` with this chip's VCEK into the signature field.
    pub fn sign_report(&self, raw: &mut [u8; REPORT_LEN]) {
        let key = p384::ecdsa::SigningKey::from(&self.vcek_key.secret);
        let sig: p384::ecdsa::Signature = key.sign(&raw[..SIGNED_LEN]);
        let (r, s) = sig.split_bytes();
        let mut r_le = [0u8; 72];
        let mut s_le = [0u8; 72];
        r_le[..48].copy_from_slice(&r);
        s_le[..48].copy_from_slice(&s);
        r_le[..48].reverse();
        s_le[..48].reverse();
        raw[field::SIGNATURE_R..field::SIGNATURE_R + 72].copy_from_slice(&r_le);
        raw[field::SIGNATURE_S..field::SIGNATURE_S + 72].copy_from_slice(&s_le);
    }

    /// A signed report over `report_data`.
    pub fn report(&self, report_data: &ReportData) -> [u8; REPORT_LEN] {
        let mut raw = self.unsigned_report(report_data);
        self.sign_report(&mut raw);
        raw
    }

    /// A bundle around `report` with this chip's VCEK and the simulated chain.
    pub fn bundle_for(&self, report: Vec<u8>, claims: Option<Claims>) -> EvidenceBundle {
        EvidenceBundle {
            report,
            endorsement: self.vcek_der.clone(),
            chain: vec![self.ask_der.clone(), self.ark_der.clone()],
            crl: None,
            claims,
            gpus: Vec::new(),
            gpu_rims: Vec::new(),
            gpu_ocsp: Vec::new(),
        }
    }

    /// Evidence for `claims`: REPORT_DATA = SHA-512(claims).
    pub fn evidence(&self, claims: &Claims) -> Result<EvidenceBundle, Error> {
        let rd = claims.report_data().map_err(|e| Error::ApiMisuse(e.to_string()))?;
        Ok(self.bundle_for(self.report(&rd).to_vec(), Some(claims.clone())))
    }

    /// Writes the hierarchy to `dir` (keys as PKCS#8 PEM, mode 0600).
    pub fn save(&self, dir: &Path) -> Result<(), Error> {
        std::fs::create_dir_all(dir)?;
        let write_secret = |name: &str, text: String| -> Result<(), Error> {
            let path = dir.join(name);
            std::fs::write(&path, text)?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
            }
            Ok(())
        };
        write_secret("ark.key.pem", self.ark_key.pem()?)?;
        write_secret("ask.key.pem", self.ask_key.pem()?)?;
        write_secret("vcek.key.pem", self.vcek_key.pem()?)?;
        std::fs::write(dir.join("ark.der"), &self.ark_der)?;
        std::fs::write(dir.join("ask.der"), &self.ask_der)?;
        std::fs::write(dir.join("vcek.der"), &self.vcek_der)?;
        let config = serde_json::to_string_pretty(&self.config).map_err(|e| Error::ApiMisuse(e.to_string()))?;
        std::fs::write(dir.join("config.json"), config)?;
        Ok(())
    }

    /// Loads a hierarchy written by [`save`](Self::save).
    pub fn load(dir: &Path) -> Result<Self, Error> {
        let read_key = |name: &str| -> Result<SimKey, Error> {
            let pem = std::fs::read_to_string(dir.join(name))?;
            let secret = p384::SecretKey::from_pkcs8_pem(&pem).map_err(|e| Error::ApiMisuse(format!("{name}: {e}")))?;
            Ok(SimKey { secret })
        };
        let config: SimulatedConfig = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)
            .map_err(|e| Error::ApiMisuse(format!("config.json: {e}")))?;
        Ok(Self {
            config,
            ark_key: read_key("ark.key.pem")?,
            ask_key: read_key("ask.key.pem")?,
            vcek_key: read_key("vcek.key.pem")?,
            ark_der: std::fs::read(dir.join("ark.der"))?,
            ask_der: std::fs::read(dir.join("ask.der"))?,
            vcek_der: std::fs::read(dir.join("vcek.der"))?,
        })
    }
}

impl crate::attester::Attester for SimulatedAttester {
    fn evidence(&self, claims: &Claims) -> Result<EvidenceBundle, Error> {
        SimulatedAttester::evidence(self, claims)
    }
}
