//! Reading evidence the way reviewers have it: a raw 1184-byte report, the
//! same as hex text, or a Veil evidence bundle (JSON).

use std::path::Path;

use veil_attestation::x509::{ParsedCert, ParsedCrl};
use veil_attestation::EvidenceBundle;

/// Why an input file could not be used (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// Path given.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The content is not what the flag asked for.
    #[error("{path}: {reason}")]
    Invalid {
        /// Path given.
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// Reads a file, bounded to 1 MiB.
pub fn read(path: &Path) -> Result<Vec<u8>, InputError> {
    let data = std::fs::read(path).map_err(|source| InputError::Read { path: path.display().to_string(), source })?;
    if data.len() > 1 << 20 {
        return Err(invalid(path, format!("{} bytes is larger than any evidence (limit 1 MiB)", data.len())));
    }
    Ok(data)
}

fn invalid(path: &Path, reason: impl Into<String>) -> InputError {
    InputError::Invalid { path: path.display().to_string(), reason: reason.into() }
}

/// What a file turned out to hold.
#[derive(Debug)]
pub enum Evidence {
    /// A bare report (raw bytes, possibly decoded from hex).
    Report(Vec<u8>),
    /// A bundle.
    Bundle(Box<EvidenceBundle>),
}

/// Loads a report or a bundle, deciding by content.
pub fn load_evidence(path: &Path) -> Result<Evidence, InputError> {
    let data = read(path)?;
    let trimmed = data.trim_ascii();
    if trimmed.starts_with(b"{") {
        return EvidenceBundle::from_json(&data)
            .map(|b| Evidence::Bundle(Box::new(b)))
            .map_err(|e| invalid(path, e.to_string()));
    }
    if !trimmed.is_empty() && trimmed.iter().all(|b| b.is_ascii_hexdigit() || b.is_ascii_whitespace()) {
        let text: String = trimmed.iter().filter(|b| !b.is_ascii_whitespace()).map(|&b| b as char).collect();
        let bytes = hex::decode(text).map_err(|e| invalid(path, format!("hex report: {e}")))?;
        return Ok(Evidence::Report(bytes));
    }
    Ok(Evidence::Report(data))
}

/// Loads a bundle from `--evidence`.
pub fn load_bundle(path: &Path) -> Result<EvidenceBundle, InputError> {
    match load_evidence(path)? {
        Evidence::Bundle(b) => Ok(*b),
        Evidence::Report(_) => {
            Err(invalid(path, "expected an evidence bundle (JSON); use --report and --vcek for a bare report"))
        }
    }
}

/// Loads a certificate (DER or PEM) as DER.
pub fn load_cert(path: &Path) -> Result<Vec<u8>, InputError> {
    let data = read(path)?;
    ParsedCert::from_der_or_pem(&data).map(|c| c.der().to_vec()).map_err(|e| invalid(path, e.to_string()))
}

/// Loads a PEM chain (or one DER certificate) as DER certificates.
pub fn load_chain(path: &Path) -> Result<Vec<Vec<u8>>, InputError> {
    let data = read(path)?;
    let certs = if data.windows(10).any(|w| w == b"-----BEGIN") {
        ParsedCert::chain_from_pem(&data).map_err(|e| invalid(path, e.to_string()))?
    } else {
        vec![ParsedCert::from_der(&data).map_err(|e| invalid(path, e.to_string()))?]
    };
    Ok(certs.into_iter().map(|c| c.der().to_vec()).collect())
}

/// Loads a CRL (DER, or PEM `X509 CRL`).
pub fn load_crl(path: &Path) -> Result<Vec<u8>, InputError> {
    let data = read(path)?;
    let der = if let Ok(text) = std::str::from_utf8(&data) {
        if let Some(body) = text.split("-----BEGIN X509 CRL-----").nth(1) {
            let body: String = body.split("-----END").next().unwrap_or_default().split_whitespace().collect();
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(body).map_err(|e| invalid(path, e.to_string()))?
        } else {
            data
        }
    } else {
        data
    };
    ParsedCrl::from_der(&der).map_err(|e| invalid(path, e.to_string()))?;
    Ok(der)
}
