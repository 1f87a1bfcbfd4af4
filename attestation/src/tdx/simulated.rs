//! A simulated TDX platform: a software hierarchy shaped like Intel's (a
//! root, a PCK CA and a PCK certificate with the SGX extension, a TCB
//! signing certificate, both CRLs), a quoting enclave that certifies an
//! attestation key, and collateral Intel-shaped and signed. It makes quotes
//! and collateral in the exact layouts, so every path of the TDX verifier
//! runs, including the ones a real sample cannot reach (a CRL that revokes
//! the PCK, a debuggable TD with a valid signature, signed collateral for
//! another platform).
//!
//! Every certificate carries [`TDX_SIMULATED_ORG`]; the verifier accepts a
//! chain ending in one only under `allow_simulated = true`, flags every row
//! SIMULATED, and warns. Simulated evidence proves nothing.

use std::time::{Duration, SystemTime};

use p256::ecdsa::signature::Signer;
use p256::pkcs8::EncodePrivateKey;
use rcgen::{CertificateParams, CustomExtension, DnType, IsCa, Issuer, KeyPair, SerialNumber};
use sha2::{Digest, Sha256, Sha512};

use super::quote::{ATT_KEY_ECDSA_P256, INTEL_QE_VENDOR_ID, QE_REPORT_LEN, TEE_TDX};
use crate::x509::ParsedCert;

/// Organisation of every simulated TDX certificate; the verifier's marker.
pub const TDX_SIMULATED_ORG: &str = "Veil SIMULATED TDX attestation - NOT Intel hardware";

/// Whether a certificate was issued by a simulated TDX hierarchy.
pub fn is_simulated_tdx_cert(cert: &ParsedCert) -> bool {
    cert.subject_string().contains(TDX_SIMULATED_ORG)
}

const NAMES: [&str; 4] = ["SIM TDX Root CA", "SIM PCK Platform CA", "SIM PCK Certificate", "SIM TCB Signing"];
/// The simulated QE's MRSIGNER.
pub const SIM_QE_MRSIGNER: [u8; 32] = [0x5E; 32];

/// What the simulated platform reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedTdxConfig {
    /// The platform family.
    pub fmspc: [u8; 6],
    /// The 16 CPU SVN components in the PCK certificate.
    pub cpu_svn: [u8; 16],
    /// The PCE SVN in the PCK certificate.
    pub pce_svn: u16,
    /// `TEE_TCB_SVN` in the TD report.
    pub tee_tcb_svn: [u8; 16],
    /// `TDATTRIBUTES` (little-endian u64).
    pub td_attributes: u64,
    /// `MRTD`.
    pub mr_td: [u8; 48],
    /// `RTMR0`..`RTMR3`.
    pub rtmr: [[u8; 48]; 4],
    /// The QE's SVN.
    pub qe_svn: u16,
}

impl Default for SimulatedTdxConfig {
    fn default() -> Self {
        let mut tee = [0u8; 16];
        tee[..3].copy_from_slice(&[6, 1, 3]);
        Self {
            fmspc: [0x5E, 0x5E, 0, 0, 0, 0],
            cpu_svn: [3; 16],
            pce_svn: 13,
            tee_tcb_svn: tee,
            td_attributes: super::TdAttributes::SEPT_VE_DISABLE,
            mr_td: [0x7D; 48],
            rtmr: [[1; 48], [2; 48], [3; 48], [0; 48]],
            qe_svn: 8,
        }
    }
}

/// The simulated platform.
pub struct SimulatedTdx {
    config: SimulatedTdxConfig,
    keys: Vec<p256::SecretKey>,
    certs: Vec<Vec<u8>>,
    att_key: p256::ecdsa::SigningKey,
}

impl std::fmt::Debug for SimulatedTdx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimulatedTdx").field("config", &self.config).finish_non_exhaustive()
    }
}

fn derive_key(seed: &[u8], label: &str) -> p256::SecretKey {
    let mut counter = 0u32;
    loop {
        let h = Sha512::new()
            .chain_update(b"veil/sim-tdx/key\0")
            .chain_update(label.as_bytes())
            .chain_update(counter.to_be_bytes())
            .chain_update(seed)
            .finalize();
        if let Ok(k) = p256::SecretKey::from_slice(&h[..32]) {
            return k;
        }
        counter += 1;
    }
}

/// Why the simulated hierarchy could not be made (a key or certificate
/// library failure; never an input of the caller's).
#[derive(Debug, thiserror::Error)]
#[error("simulated TDX: {0}")]
pub struct Error(String);

fn gen_err(e: impl std::fmt::Display) -> Error {
    Error(e.to_string())
}

fn rcgen_key(secret: &p256::SecretKey) -> Result<KeyPair, Error> {
    let der = secret.to_pkcs8_der().map_err(gen_err)?;
    let pkcs8 = rustls::pki_types::PrivatePkcs8KeyDer::from(der.as_bytes());
    KeyPair::from_pkcs8_der_and_sign_algo(&pkcs8, &rcgen::PKCS_ECDSA_P256_SHA256).map_err(gen_err)
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(0))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// A DER TLV with a short or long length.
fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match content.len() {
        n if n < 0x80 => out.push(n as u8),
        n if n < 0x100 => out.extend_from_slice(&[0x81, n as u8]),
        n => out.extend_from_slice(&[0x82, (n >> 8) as u8, n as u8]),
    }
    out.extend_from_slice(content);
    out
}

fn oid(arcs: &str) -> Vec<u8> {
    tlv(0x06, const_oid::ObjectIdentifier::new_unwrap(arcs).as_bytes())
}

fn integer(v: u16) -> Vec<u8> {
    let b = v.to_be_bytes();
    let digits: &[u8] = if v < 0x80 {
        &b[1..]
    } else if v < 0x100 {
        &[0, b[1]]
    } else {
        &b
    };
    tlv(0x02, digits)
}

fn entry(arcs: &str, value: Vec<u8>) -> Vec<u8> {
    tlv(0x30, &[oid(arcs), value].concat())
}

/// The SGX extension of a PCK certificate: PPID, TCB (16 components, PCESVN, CPUSVN), PCE ID, FMSPC, SGX type.
fn sgx_extension(c: &SimulatedTdxConfig) -> Vec<u8> {
    let base = "1.2.840.113741.1.13.1";
    let mut tcb = Vec::new();
    for (i, svn) in c.cpu_svn.iter().enumerate() {
        tcb.extend(entry(&format!("{base}.2.{}", i + 1), integer(u16::from(*svn))));
    }
    tcb.extend(entry(&format!("{base}.2.17"), integer(c.pce_svn)));
    tcb.extend(entry(&format!("{base}.2.18"), tlv(0x04, &c.cpu_svn)));
    let body = [
        entry(&format!("{base}.1"), tlv(0x04, &[0x99; 16])),
        entry(&format!("{base}.2"), tlv(0x30, &tcb)),
        entry(&format!("{base}.3"), tlv(0x04, &[0, 0])),
        entry(&format!("{base}.4"), tlv(0x04, &c.fmspc)),
        entry(&format!("{base}.5"), tlv(0x0A, &[0])),
    ]
    .concat();
    tlv(0x30, &body)
}

/// What the simulated collateral says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedCollateral {
    /// The FMSPC the TCB info rates (the platform's, unless testing another).
    pub fmspc: [u8; 6],
    /// `issueDate`.
    pub issued: SystemTime,
    /// `nextUpdate` (and the CRLs' next update).
    pub next_update: SystemTime,
    /// Serials the PCK CRL revokes.
    pub revoked_pck_serials: Vec<Vec<u8>>,
    /// The platform levels, best first.
    pub levels: Vec<SimulatedLevel>,
}

/// One platform TCB level of simulated collateral.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimulatedLevel {
    /// The 16 CPU SVN components it requires.
    pub cpu_svn: [u8; 16],
    /// The PCE SVN it requires.
    pub pce_svn: u16,
    /// The 16 TEE TCB SVN components it requires.
    pub tee_tcb_svn: [u8; 16],
    /// Its status, as Intel names it.
    pub status: &'static str,
    /// Its advisories.
    pub advisories: Vec<String>,
}

impl SimulatedTdx {
    /// A platform whose keys derive from `seed` (fixed seeds for tests).
    pub fn from_seed(seed: &[u8], config: SimulatedTdxConfig) -> Result<Self, Error> {
        let keys: Vec<p256::SecretKey> = NAMES.iter().map(|n| derive_key(seed, n)).collect();
        let kps = keys.iter().map(rcgen_key).collect::<Result<Vec<_>, _>>()?;
        let certs = Self::issue(&config, &kps)?;
        let att_key = p256::ecdsa::SigningKey::from(derive_key(seed, "attestation key"));
        Ok(Self { config, keys, certs, att_key })
    }

    fn params(i: usize, config: &SimulatedTdxConfig) -> CertificateParams {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_704_067_200); // 2024-01-01
        let end = SystemTime::UNIX_EPOCH + Duration::from_secs(2_650_838_400); // 2054-01-01
        let mut p = CertificateParams::default();
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(DnType::OrganizationName, TDX_SIMULATED_ORG);
        p.distinguished_name.push(DnType::CommonName, NAMES[i]);
        p.serial_number = Some(SerialNumber::from_slice(&[0x10 + i as u8]));
        p.not_before = offset(start);
        p.not_after = offset(end);
        match i {
            0 | 1 => p.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained),
            2 => {
                p.custom_extensions =
                    vec![CustomExtension::from_oid_content(&[1, 2, 840, 113741, 1, 13, 1], sgx_extension(config))]
            }
            _ => {}
        }
        p
    }

    fn issue(config: &SimulatedTdxConfig, kps: &[KeyPair]) -> Result<Vec<Vec<u8>>, Error> {
        let root = Self::params(0, config).self_signed(&kps[0]).map_err(gen_err)?;
        let root_issuer = Issuer::new(Self::params(0, config), &kps[0]);
        let ca = Self::params(1, config).signed_by(&kps[1], &root_issuer).map_err(gen_err)?;
        let ca_issuer = Issuer::new(Self::params(1, config), &kps[1]);
        let leaf = Self::params(2, config).signed_by(&kps[2], &ca_issuer).map_err(gen_err)?;
        let tcb = Self::params(3, config).signed_by(&kps[3], &root_issuer).map_err(gen_err)?;
        Ok(vec![root.der().to_vec(), ca.der().to_vec(), leaf.der().to_vec(), tcb.der().to_vec()])
    }

    /// The configuration.
    pub fn config(&self) -> &SimulatedTdxConfig {
        &self.config
    }

    /// The PCK certificate's serial number.
    pub fn pck_serial(&self) -> Vec<u8> {
        vec![0x12]
    }

    fn pem(&self, i: usize) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD.encode(&self.certs[i]);
        let lines: Vec<&str> = b64.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or("")).collect();
        format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"))
    }

    /// A quote of a TD report with `report_data`, in the v4 layout.
    pub fn quote(&self, report_data: [u8; 64]) -> Vec<u8> {
        let c = &self.config;
        let mut q = Vec::new();
        q.extend_from_slice(&4u16.to_le_bytes());
        q.extend_from_slice(&ATT_KEY_ECDSA_P256.to_le_bytes());
        q.extend_from_slice(&TEE_TDX.to_le_bytes());
        q.extend_from_slice(&[0; 4]);
        q.extend_from_slice(&INTEL_QE_VENDOR_ID);
        q.extend_from_slice(&[0; 20]);
        q.extend_from_slice(&c.tee_tcb_svn);
        q.extend_from_slice(&[0x3A; 48]); // MRSEAM
        q.extend_from_slice(&[0; 48]); // MRSIGNERSEAM (Intel's module: zero)
        q.extend_from_slice(&[0; 8]); // SEAMATTRIBUTES
        q.extend_from_slice(&c.td_attributes.to_le_bytes());
        q.extend_from_slice(&0x0006_02e7u64.to_le_bytes()); // XFAM
        q.extend_from_slice(&c.mr_td);
        q.extend_from_slice(&[0; 48 * 3]); // MRCONFIGID, MROWNER, MROWNERCONFIG
        for r in &c.rtmr {
            q.extend_from_slice(r);
        }
        q.extend_from_slice(&report_data);
        let sig: p256::ecdsa::Signature = self.att_key.sign(&q);
        let point = self.att_key.verifying_key().to_encoded_point(false);
        let att_pub = &point.as_bytes()[1..];
        let auth = [0xA5u8; 32];
        let mut qe = [0u8; QE_REPORT_LEN];
        qe[48] = 0x11; // ATTRIBUTES: INIT | MODE64BIT, not DEBUG
        qe[128..160].copy_from_slice(&SIM_QE_MRSIGNER);
        qe[256..258].copy_from_slice(&2u16.to_le_bytes());
        qe[258..260].copy_from_slice(&c.qe_svn.to_le_bytes());
        let h: [u8; 32] = Sha256::new().chain_update(att_pub).chain_update(auth).finalize().into();
        qe[320..352].copy_from_slice(&h);
        let pck = p256::ecdsa::SigningKey::from(&self.keys[2]);
        let qe_sig: p256::ecdsa::Signature = pck.sign(&qe);
        let chain = [self.pem(2), self.pem(1), self.pem(0)].concat();
        let mut cert = qe.to_vec();
        cert.extend_from_slice(&qe_sig.to_bytes());
        cert.extend_from_slice(&(auth.len() as u16).to_le_bytes());
        cert.extend_from_slice(&auth);
        cert.extend_from_slice(&5u16.to_le_bytes());
        cert.extend_from_slice(&(chain.len() as u32).to_le_bytes());
        cert.extend_from_slice(chain.as_bytes());
        let mut s = sig.to_bytes().to_vec();
        s.extend_from_slice(att_pub);
        s.extend_from_slice(&6u16.to_le_bytes());
        s.extend_from_slice(&(cert.len() as u32).to_le_bytes());
        s.extend_from_slice(&cert);
        q.extend_from_slice(&(s.len() as u32).to_le_bytes());
        q.extend_from_slice(&s);
        q
    }

    /// Collateral the default way: this platform's FMSPC, one UpToDate
    /// level it reaches, valid from `now` minus an hour for 30 days, no
    /// revocations.
    pub fn default_collateral(&self, now: SystemTime) -> SimulatedCollateral {
        let c = &self.config;
        SimulatedCollateral {
            fmspc: c.fmspc,
            issued: now - Duration::from_secs(3600),
            next_update: now + Duration::from_secs(30 * 86400),
            revoked_pck_serials: Vec::new(),
            levels: vec![SimulatedLevel {
                cpu_svn: c.cpu_svn,
                pce_svn: c.pce_svn,
                tee_tcb_svn: c.tee_tcb_svn,
                status: "UpToDate",
                advisories: Vec::new(),
            }],
        }
    }

    /// Collateral in the PCCS JSON form, signed by the simulated hierarchy.
    pub fn collateral(&self, s: &SimulatedCollateral) -> Result<Vec<u8>, Error> {
        let date = |t: SystemTime| crate::x509::fmt_time(t);
        let comps = |v: &[u8; 16]| v.iter().map(|x| serde_json::json!({ "svn": x })).collect::<Vec<_>>();
        let levels: Vec<serde_json::Value> = s
            .levels
            .iter()
            .map(|l| {
                serde_json::json!({
                    "tcb": {
                        "sgxtcbcomponents": comps(&l.cpu_svn),
                        "pcesvn": l.pce_svn,
                        "tdxtcbcomponents": comps(&l.tee_tcb_svn),
                    },
                    "tcbDate": "2024-01-01T00:00:00Z", "tcbStatus": l.status, "advisoryIDs": l.advisories,
                })
            })
            .collect();
        let zero48 = "00".repeat(48);
        let tcb_info = serde_json::json!({
            "id": "TDX", "version": 3, "issueDate": date(s.issued), "nextUpdate": date(s.next_update),
            "fmspc": hex::encode_upper(s.fmspc), "pceId": "0000", "tcbType": 0, "tcbEvaluationDataNumber": 1,
            "tdxModule": { "mrsigner": zero48, "attributes": "0000000000000000", "attributesMask": "FFFFFFFFFFFFFFFF" },
            "tdxModuleIdentities": [{
                "id": format!("TDX_{:02X}", self.config.tee_tcb_svn[1]), "mrsigner": zero48,
                "attributes": "0000000000000000", "attributesMask": "FFFFFFFFFFFFFFFF",
                "tcbLevels": [{ "tcb": { "isvsvn": 1 }, "tcbDate": "2024-01-01T00:00:00Z", "tcbStatus": "UpToDate" }],
            }],
            "tcbLevels": levels,
        })
        .to_string();
        let qe_identity = serde_json::json!({
            "id": "TD_QE", "version": 2, "issueDate": date(s.issued), "nextUpdate": date(s.next_update),
            "tcbEvaluationDataNumber": 1, "miscselect": "00000000", "miscselectMask": "FFFFFFFF",
            "attributes": "11000000000000000000000000000000", "attributesMask": "FBFFFFFFFFFFFFFF0000000000000000",
            "mrsigner": hex::encode_upper(SIM_QE_MRSIGNER), "isvprodid": 2,
            "tcbLevels": [{ "tcb": { "isvsvn": 1 }, "tcbDate": "2024-01-01T00:00:00Z", "tcbStatus": "UpToDate" }],
        })
        .to_string();
        let tcb_signer = p256::ecdsa::SigningKey::from(&self.keys[3]);
        let sign = |body: &str| -> String {
            let sig: p256::ecdsa::Signature = tcb_signer.sign(body.as_bytes());
            hex::encode(sig.to_bytes())
        };
        let kps = self.keys.iter().map(rcgen_key).collect::<Result<Vec<_>, _>>()?;
        let crl = |issuer: usize, serials: &[Vec<u8>]| -> Result<String, Error> {
            let params = rcgen::CertificateRevocationListParams {
                this_update: offset(s.issued),
                next_update: offset(s.next_update),
                crl_number: SerialNumber::from_slice(&[1]),
                issuing_distribution_point: None,
                revoked_certs: serials
                    .iter()
                    .map(|serial| rcgen::RevokedCertParams {
                        serial_number: SerialNumber::from_slice(serial),
                        revocation_time: offset(s.issued),
                        reason_code: None,
                        invalidity_date: None,
                    })
                    .collect(),
                key_identifier_method: rcgen::KeyIdMethod::Sha256,
            };
            let issuer = Issuer::new(Self::params(issuer, &self.config), &kps[issuer]);
            Ok(hex::encode(params.signed_by(&issuer).map_err(gen_err)?.der()))
        };
        let (pck_chain, signing_chain) = ([self.pem(1), self.pem(0)].concat(), [self.pem(3), self.pem(0)].concat());
        let doc = serde_json::json!({
            "pck_crl_issuer_chain": pck_chain,
            "root_ca_crl": crl(0, &[])?,
            "pck_crl": crl(1, &s.revoked_pck_serials)?,
            "tcb_info_issuer_chain": signing_chain.clone(),
            "tcb_info_signature": sign(&tcb_info),
            "tcb_info": tcb_info,
            "qe_identity_issuer_chain": signing_chain,
            "qe_identity_signature": sign(&qe_identity),
            "qe_identity": qe_identity,
        });
        Ok(doc.to_string().into_bytes())
    }
}
