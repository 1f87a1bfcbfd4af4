//! The simulated GPU attester: a software device chain shaped like
//! NVIDIA's (five ECDSA P-384 certificates, DICE TcbInfo FWID in the leaf)
//! that signs SPDM `GET_MEASUREMENTS` transcripts in the exact layout, so
//! every GPU verifier path runs without a GPU.
//!
//! Every certificate carries [`GPU_SIMULATED_ORG`] as its organisation; the
//! verifier accepts the chain only under `allow_simulated = true`, with a
//! warning in the GPU table. Simulated GPU evidence proves nothing.

use std::time::{Duration, SystemTime};

use p384::ecdsa::signature::Signer;
use p384::pkcs8::EncodePrivateKey;
use rcgen::{CertificateParams, CustomExtension, DnType, IsCa, Issuer, KeyPair, SerialNumber};
use sha2::{Digest, Sha384, Sha512};

use crate::claims::Claims;
use crate::error::Error;
use crate::gpu::evidence::{gpu_evidence_digest, CcSettings, GpuEvidence};
use crate::gpu::spdm::{field, MeasurementBlock, OpaqueData, OpaqueField, TranscriptBuilder, STATUS_OFF, STATUS_ON};
use crate::x509::ParsedCert;

/// Organisation of every simulated GPU certificate; the verifier's marker.
pub const GPU_SIMULATED_ORG: &str = "Veil SIMULATED GPU attestation - NOT NVIDIA hardware";
/// Number of measurement blocks a simulated Hopper reports.
pub const BLOCKS: u8 = 64;
/// RIM indices the simulated driver RIM claims (the rest belong to the VBIOS RIM).
pub const DRIVER_INDICES: std::ops::Range<u32> = 32..64;

/// Whether a certificate was issued by a simulated GPU hierarchy.
pub fn is_simulated_gpu_cert(cert: &ParsedCert) -> bool {
    cert.subject_string().contains(GPU_SIMULATED_ORG)
}

/// What the simulated GPU reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedGpuConfig {
    /// Driver version string.
    pub driver_version: String,
    /// VBIOS version bytes (printed 3.2.1.0.4).
    pub vbios: [u8; 8],
    /// Protected PCIe on.
    pub protected_pcie: bool,
    /// Feature flag written to the opaque data (0, 1, 2 are CC modes).
    pub feature_flag: u16,
    /// What the collector reports (None: no report).
    pub settings: Option<CcSettings>,
    /// Label the 64 measurement values are derived from.
    pub firmware_label: String,
}

impl Default for SimulatedGpuConfig {
    fn default() -> Self {
        Self {
            driver_version: "570.86.10".into(),
            vbios: [0x00, 0xAF, 0x00, 0x96, 0x01, 0, 0, 0],
            protected_pcie: false,
            feature_flag: 1,
            settings: Some(CcSettings { cc_mode: true, devtools_mode: false }),
            firmware_label: "veil simulated GH100 firmware".into(),
        }
    }
}

fn derive_key(seed: &[u8], label: &str) -> p384::SecretKey {
    let mut counter = 0u32;
    loop {
        let h = Sha512::new()
            .chain_update(b"veil/sim-gpu/key\0")
            .chain_update(label.as_bytes())
            .chain_update(counter.to_be_bytes())
            .chain_update(seed)
            .finalize();
        if let Ok(k) = p384::SecretKey::from_slice(&h[..48]) {
            return k;
        }
        counter += 1;
    }
}

fn rcgen_key(secret: &p384::SecretKey) -> Result<KeyPair, Error> {
    let der = secret.to_pkcs8_der().map_err(|e| Error::ApiMisuse(e.to_string()))?;
    let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(der.as_bytes());
    KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ECDSA_P384_SHA384)
        .map_err(|e| Error::ApiMisuse(format!("certificate generation: {e}")))
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// DER of a DICE TcbInfo carrying one SHA-384 FWID: `SEQUENCE { [6] { SEQUENCE { id-sha384, OCTET STRING } } }`.
pub fn tcb_info_der(fwid: &[u8; 48]) -> Vec<u8> {
    let mut fw = vec![0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x02, 0x04, 0x30];
    fw.extend_from_slice(fwid);
    let mut one = vec![0x30, u8::try_from(fw.len()).unwrap_or(0)];
    one.extend_from_slice(&fw);
    let mut list = vec![0xA6, u8::try_from(one.len()).unwrap_or(0)];
    list.extend_from_slice(&one);
    let mut out = vec![0x30, u8::try_from(list.len()).unwrap_or(0)];
    out.extend_from_slice(&list);
    out
}

/// A simulated GPU with its device chain.
#[derive(Clone)]
pub struct SimulatedGpu {
    config: SimulatedGpuConfig,
    leaf_key: p384::ecdsa::SigningKey,
    keys: Vec<p384::SecretKey>,
    chain: Vec<Vec<u8>>,
    fwid: [u8; 48],
}

impl std::fmt::Debug for SimulatedGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedGpu").field("config", &self.config).field("leaf_key", &"<redacted>").finish()
    }
}

const NAMES: [&str; 5] = [
    "SIM GH100 GSP FMC LF",
    "SIM GH100 GSP BROM",
    "SIM GH100 Provisioner ICA",
    "SIM GH100 Identity",
    "SIM Device Identity CA",
];

impl SimulatedGpu {
    /// A GPU whose keys derive from `seed` (fixed seeds for tests).
    pub fn from_seed(seed: &[u8], config: SimulatedGpuConfig) -> Result<Self, Error> {
        let keys: Vec<p384::SecretKey> = (0..5).map(|i| derive_key(seed, NAMES[i])).collect();
        let fwid: [u8; 48] = Sha384::new().chain_update(b"veil/sim-gpu/fwid\0").chain_update(seed).finalize().into();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200); // 2024-01-01
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(2_650_838_400); // 2054-01-01
        let params = |i: usize| {
            let mut p = CertificateParams::default();
            p.distinguished_name = rcgen::DistinguishedName::new();
            p.distinguished_name.push(DnType::OrganizationName, GPU_SIMULATED_ORG);
            p.distinguished_name.push(DnType::CommonName, NAMES[i]);
            p.serial_number = Some(SerialNumber::from_slice(&[u8::try_from(i + 1).unwrap_or(1)]));
            p.not_before = offset(start);
            p.not_after = offset(end);
            if i > 0 {
                p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            } else {
                p.custom_extensions =
                    vec![CustomExtension::from_oid_content(&[2, 23, 133, 5, 4, 1], tcb_info_der(&fwid))];
            }
            p
        };
        let kps = keys.iter().map(rcgen_key).collect::<Result<Vec<_>, _>>()?;
        let gen = |e: rcgen::Error| Error::ApiMisuse(format!("certificate generation: {e}"));
        let mut chain = vec![Vec::new(); 5];
        chain[4] = params(4).self_signed(&kps[4]).map_err(gen)?.der().to_vec();
        for i in (0..4).rev() {
            let issuer = Issuer::new(params(i + 1), &kps[i + 1]);
            chain[i] = params(i).signed_by(&kps[i], &issuer).map_err(gen)?.der().to_vec();
        }
        let leaf_key = p384::ecdsa::SigningKey::from(&keys[0]);
        Ok(Self { config, leaf_key, keys, chain, fwid })
    }

    /// The device chain, DER, leaf first.
    pub fn chain_der(&self) -> &[Vec<u8>] {
        &self.chain
    }

    /// The configuration.
    pub fn config(&self) -> &SimulatedGpuConfig {
        &self.config
    }

    /// Measurement value of SPDM block `index` (1-based).
    pub fn measurement(&self, index: u8) -> [u8; 48] {
        Sha384::new()
            .chain_update(b"veil/sim-gpu/measurement\0")
            .chain_update(self.config.firmware_label.as_bytes())
            .chain_update([index])
            .finalize()
            .into()
    }

    /// The driver version string.
    pub fn driver_version(&self) -> &str {
        &self.config.driver_version
    }

    /// The VBIOS version as printed.
    pub fn vbios_version(&self) -> String {
        let v = self.config.vbios;
        format!("{:02X}.{:02X}.{:02X}.{:02X}.{:02X}", v[3], v[2], v[1], v[0], v[4])
    }

    /// The transcript builder for `nonce` (tests edit it before signing).
    pub fn transcript(&self, nonce: [u8; 32]) -> TranscriptBuilder {
        let mut driver = self.config.driver_version.as_bytes().to_vec();
        driver.push(0);
        let status = |on: bool| vec![if on { STATUS_ON } else { STATUS_OFF }];
        let opaque = OpaqueData {
            fields: vec![
                OpaqueField { field_type: field::VBIOS_VERSION, value: self.config.vbios.to_vec() },
                OpaqueField { field_type: field::CHIP_SKU, value: b"882\0".to_vec() },
                OpaqueField { field_type: field::PROJECT, value: b"1010\0".to_vec() },
                OpaqueField { field_type: field::PROJECT_SKU, value: b"0200\0".to_vec() },
                OpaqueField { field_type: field::DRIVER_VERSION, value: driver },
                OpaqueField { field_type: field::NVDEC0_STATUS, value: status(false) },
                OpaqueField { field_type: field::FWID, value: self.fwid.to_vec() },
                OpaqueField { field_type: field::PROTECTED_PCIE_STATUS, value: status(self.config.protected_pcie) },
                OpaqueField { field_type: field::OPAQUE_DATA_VERSION, value: 1u16.to_le_bytes().to_vec() },
                OpaqueField { field_type: field::FEATURE_FLAG, value: self.config.feature_flag.to_le_bytes().to_vec() },
            ],
        };
        let responder_nonce: [u8; 32] = {
            let h = Sha512::new().chain_update(b"veil/sim-gpu/responder-nonce\0").chain_update(nonce).finalize();
            let mut n = [0u8; 32];
            n.copy_from_slice(&h[..32]);
            n
        };
        TranscriptBuilder {
            request_nonce: nonce,
            blocks: (1..=BLOCKS)
                .map(|i| MeasurementBlock { index: i, value_type: 0x01, value: self.measurement(i).to_vec() })
                .collect(),
            responder_nonce,
            opaque,
        }
    }

    /// Signs a transcript: request ‖ response ‖ r ‖ s.
    pub fn sign(&self, transcript: &TranscriptBuilder) -> Vec<u8> {
        let mut bytes = transcript.signed_part();
        let sig: p384::ecdsa::Signature = self.leaf_key.sign(&bytes);
        bytes.extend_from_slice(&sig.to_bytes());
        bytes
    }

    /// Evidence answering `nonce`.
    pub fn evidence_with_nonce(&self, nonce: [u8; 32]) -> GpuEvidence {
        GpuEvidence {
            arch: "HOPPER".into(),
            report: self.sign(&self.transcript(nonce)),
            cert_chain: self.chain.clone(),
            settings: self.config.settings,
        }
    }

    /// Evidence for GPU `gpu_index` of a shard making `claims`.
    pub fn evidence_for(&self, claims: &Claims, gpu_index: u32) -> Result<GpuEvidence, Error> {
        Ok(self.evidence_with_nonce(claims.gpu_nonce(gpu_index).map_err(|e| Error::ApiMisuse(e.to_string()))?))
    }

    /// A RIM (SWID XML, unsigned) with this GPU's golden values: the driver
    /// RIM covers [`DRIVER_INDICES`], the VBIOS RIM the other indices.
    pub fn rim_xml(&self, driver: bool) -> String {
        let version = if driver { self.config.driver_version.clone() } else { self.vbios_version() };
        let mut s = format!(
            r#"<SoftwareIdentity xmlns="http://standards.iso.org/iso/19770/-2/2015/schema.xsd" xmlns:SHA384="http://www.w3.org/2001/04/xmlenc#sha384" name="GH100" tagId="veil-sim-{}" version="1.0"><Meta colloquialVersion="{version}" product="GH100"/><Payload>"#,
            if driver { "driver" } else { "vbios" }
        );
        for i in 0..u32::from(BLOCKS) {
            if DRIVER_INDICES.contains(&i) != driver {
                continue;
            }
            let value = hex::encode(self.measurement(u8::try_from(i + 1).unwrap_or(0)));
            s.push_str(&format!(
                r#"<Resource type="Measurement" index="{i}" active="True" alternatives="1" SHA384:Hash0="{value}" name="Measurement_{i}" size="48"/>"#
            ));
        }
        s.push_str("</Payload></SoftwareIdentity>");
        s
    }
}

impl SimulatedGpu {
    /// OCSP responses for the four non-root certificates of the chain, each
    /// signed by the certificate's issuer (SHA-256 CertIDs). `revoked`: the
    /// index of a certificate reported revoked (reason certificateHold).
    pub fn ocsp_responses(
        &self,
        revoked: Option<usize>,
        this_update: SystemTime,
        next_update: Option<SystemTime>,
    ) -> Result<Vec<Vec<u8>>, Error> {
        use der::{Decode, Encode};
        use x509_ocsp::builder::OcspResponseBuilder;
        use x509_ocsp::{CertId, CertStatus, OcspGeneralizedTime, ResponderId, RevokedInfo, SingleResponse};
        let err = |e: &dyn std::fmt::Display| Error::ApiMisuse(format!("simulated OCSP: {e}"));
        let time = |t: SystemTime| -> Result<OcspGeneralizedTime, Error> {
            let d = t.duration_since(SystemTime::UNIX_EPOCH).map_err(|e| err(&e))?;
            Ok(OcspGeneralizedTime::from(der::DateTime::from_unix_duration(d).map_err(|e| err(&e))?))
        };
        let mut out = Vec::new();
        for i in 0..4 {
            let cert = x509_cert::Certificate::from_der(&self.chain[i]).map_err(|e| err(&e))?;
            let issuer = x509_cert::Certificate::from_der(&self.chain[i + 1]).map_err(|e| err(&e))?;
            let id = CertId::from_issuer::<sha2::Sha256>(&issuer, cert.tbs_certificate.serial_number.clone())
                .map_err(|e| err(&e))?;
            let status = if revoked == Some(i) {
                CertStatus::revoked(RevokedInfo {
                    revocation_time: time(this_update)?,
                    revocation_reason: Some(x509_cert::ext::pkix::CrlReason::CertificateHold),
                })
            } else {
                CertStatus::good()
            };
            let mut single = SingleResponse::new(id, status, time(this_update)?);
            if let Some(n) = next_update {
                single = single.with_next_update(time(n)?);
            }
            let mut signer = p384::ecdsa::SigningKey::from(&self.keys[i + 1]);
            let response = OcspResponseBuilder::new(ResponderId::ByName(issuer.tbs_certificate.subject.clone()))
                .with_single_response(single)
                .sign::<_, p384::ecdsa::DerSignature>(&mut signer, None, time(this_update)?)
                .map_err(|e| err(&e))?;
            out.push(response.to_der().map_err(|e| err(&e))?);
        }
        Ok(out)
    }
}

/// Composite evidence for one shard: each GPU answers the nonce derived
/// from `claims`, then the claims commit to the digest of all GPU evidence.
/// Returns the completed claims (to pass to the CPU attester) and the GPU evidence.
pub fn composite(gpus: &[SimulatedGpu], claims: &Claims) -> Result<(Claims, Vec<GpuEvidence>), Error> {
    let evidence = gpus
        .iter()
        .enumerate()
        .map(|(i, g)| g.evidence_for(claims, u32::try_from(i).unwrap_or(u32::MAX)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut bound = claims.clone();
    bound.gpu_evidence_hash = Some(gpu_evidence_digest(&evidence));
    Ok((bound, evidence))
}
