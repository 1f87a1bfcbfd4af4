//! A TPM 2.0 quote from the vTPM: `TPMS_ATTEST` (the signed message), its
//! signature, and the PCR values it summarises, in the serialisation
//! Microsoft's `az-cvm-vtpm` crate writes (each part a u64-LE length, then
//! its bytes; the PCRs a u64-LE count of 32-byte SHA-256 values).

/// Largest quote file parsed.
pub const MAX_QUOTE_BYTES: usize = 16 * 1024;
/// `TPM_GENERATED_VALUE`: every TPM-made structure begins with it.
const TPM_GENERATED: u32 = 0xff54_4347;
/// `TPM_ST_ATTEST_QUOTE`.
const ST_ATTEST_QUOTE: u16 = 0x8018;
/// `TPM_ALG_SHA256`.
pub const ALG_SHA256: u16 = 0x000b;

/// Why quote bytes do not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("TPM quote: {0}")]
pub struct TpmError(pub String);

/// One PCR bank the quote selects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcrSelection {
    /// The bank's hash algorithm.
    pub alg: u16,
    /// Selected PCR indexes, ascending.
    pub pcrs: Vec<u8>,
}

/// A parsed quote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpmQuote {
    /// The signed `TPMS_ATTEST` bytes.
    pub message: Vec<u8>,
    /// The AK's signature over `message` (RSASSA-PKCS1-v1_5 SHA-256).
    pub signature: Vec<u8>,
    /// PCR values (SHA-256 bank, index order) as the quoting side read them.
    pub pcr_values: Vec<[u8; 32]>,
    /// `extraData`: the qualifying data (the verifier's nonce).
    pub extra_data: Vec<u8>,
    /// `pcrSelect`.
    pub selection: Vec<PcrSelection>,
    /// `pcrDigest`.
    pub pcr_digest: Vec<u8>,
    /// `clockInfo.clock` (milliseconds the TPM has run).
    pub clock: u64,
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], TpmError> {
        let out = self
            .b
            .get(self.at..self.at.checked_add(n).ok_or_else(|| TpmError(format!("{what}: length overflows")))?)
            .ok_or_else(|| TpmError(format!("{what}: {n} bytes at offset {} run past the end", self.at)))?;
        self.at += n;
        Ok(out)
    }
    fn be16(&mut self, what: &str) -> Result<u16, TpmError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn be32(&mut self, what: &str) -> Result<u32, TpmError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn be64(&mut self, what: &str) -> Result<u64, TpmError> {
        let b = self.take(8, what)?;
        Ok(u64::from_be_bytes(b.try_into().unwrap_or_default()))
    }
    fn le64_len(&mut self, what: &str) -> Result<usize, TpmError> {
        let b = self.take(8, what)?;
        let n = u64::from_le_bytes(b.try_into().unwrap_or_default());
        usize::try_from(n)
            .ok()
            .filter(|n| *n <= MAX_QUOTE_BYTES)
            .ok_or_else(|| TpmError(format!("{what}: {n} is too large")))
    }
    fn sized(&mut self, what: &str) -> Result<&'a [u8], TpmError> {
        let n = usize::from(self.be16(what)?);
        self.take(n, what)
    }
}

impl TpmQuote {
    /// Parses the `az-cvm-vtpm` serialisation and the `TPMS_ATTEST` inside it.
    pub fn parse(bytes: &[u8]) -> Result<Self, TpmError> {
        if bytes.len() > MAX_QUOTE_BYTES {
            return Err(TpmError(format!("{} bytes, above the {MAX_QUOTE_BYTES}-byte limit", bytes.len())));
        }
        let mut r = Reader { b: bytes, at: 0 };
        let n = r.le64_len("signature length")?;
        let signature = r.take(n, "signature")?.to_vec();
        let n = r.le64_len("message length")?;
        let message = r.take(n, "message")?.to_vec();
        let count = r.le64_len("PCR count")?;
        if count > 24 {
            return Err(TpmError(format!("{count} PCR values, at most 24")));
        }
        let mut pcr_values = Vec::with_capacity(count);
        for _ in 0..count {
            pcr_values.push(r.take(32, "PCR value")?.try_into().unwrap_or([0; 32]));
        }
        if r.at != bytes.len() {
            return Err(TpmError(format!("{} trailing bytes", bytes.len() - r.at)));
        }
        let mut m = Reader { b: &message, at: 0 };
        if m.be32("magic")? != TPM_GENERATED {
            return Err(TpmError("the message does not begin with TPM_GENERATED_VALUE".into()));
        }
        let ty = m.be16("type")?;
        if ty != ST_ATTEST_QUOTE {
            return Err(TpmError(format!("attestation type {ty:#06x}, expected TPM_ST_ATTEST_QUOTE (0x8018)")));
        }
        m.sized("qualifiedSigner")?;
        let extra_data = m.sized("extraData")?.to_vec();
        let clock = m.be64("clock")?;
        m.take(4 + 4 + 1, "clockInfo")?;
        m.take(8, "firmwareVersion")?;
        let banks = m.be32("pcrSelect count")?;
        if banks > 16 {
            return Err(TpmError(format!("{banks} PCR banks selected")));
        }
        let mut selection = Vec::new();
        for _ in 0..banks {
            let alg = m.be16("pcrSelect hash")?;
            let map = m.sized8("pcrSelect bitmap")?;
            let pcrs = (0..map.len() * 8).filter(|i| map[i / 8] & (1 << (i % 8)) != 0).map(|i| i as u8).collect();
            selection.push(PcrSelection { alg, pcrs });
        }
        let pcr_digest = m.sized("pcrDigest")?.to_vec();
        if m.at != message.len() {
            return Err(TpmError(format!("{} trailing bytes in TPMS_ATTEST", message.len() - m.at)));
        }
        Ok(Self { message, signature, pcr_values, extra_data, selection, pcr_digest, clock })
    }

    /// SHA-256 over the selected SHA-256 PCR values, in index order: what
    /// `pcrDigest` must equal. `None` when a selected PCR has no value or a
    /// bank other than SHA-256 is selected.
    pub fn computed_pcr_digest(&self) -> Option<[u8; 32]> {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for s in &self.selection {
            if s.alg != ALG_SHA256 {
                return None;
            }
            for i in &s.pcrs {
                h.update(self.pcr_values.get(usize::from(*i))?);
            }
        }
        Some(h.finalize().into())
    }

    /// The SHA-256 PCR indexes the quote covers.
    pub fn selected_sha256(&self) -> Vec<u8> {
        self.selection.iter().filter(|s| s.alg == ALG_SHA256).flat_map(|s| s.pcrs.iter().copied()).collect()
    }
}

impl Reader<'_> {
    fn sized8(&mut self, what: &str) -> Result<&[u8], TpmError> {
        let n = usize::from(self.take(1, what)?[0]);
        if n > 4 {
            return Err(TpmError(format!("{what}: {n} bytes, at most 4")));
        }
        self.take(n, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quote(extra: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&TPM_GENERATED.to_be_bytes());
        m.extend_from_slice(&ST_ATTEST_QUOTE.to_be_bytes());
        m.extend_from_slice(&[0, 2, 0, 0xb]);
        m.extend_from_slice(&(extra.len() as u16).to_be_bytes());
        m.extend_from_slice(extra);
        m.extend_from_slice(&[0; 8 + 4 + 4 + 1 + 8]);
        m.extend_from_slice(&1u32.to_be_bytes());
        m.extend_from_slice(&ALG_SHA256.to_be_bytes());
        m.extend_from_slice(&[3, 0b0000_0101, 0, 0]);
        m.extend_from_slice(&[0, 32]);
        m.extend_from_slice(&[9; 32]);
        let mut q = Vec::new();
        q.extend_from_slice(&4u64.to_le_bytes());
        q.extend_from_slice(&[1, 2, 3, 4]);
        q.extend_from_slice(&(m.len() as u64).to_le_bytes());
        q.extend_from_slice(&m);
        q.extend_from_slice(&3u64.to_le_bytes());
        for i in 0..3u8 {
            q.extend_from_slice(&[i; 32]);
        }
        q
    }

    #[test]
    fn parses_the_selection_and_computes_the_digest_over_selected_pcrs() {
        let q = TpmQuote::parse(&quote(b"nonce")).unwrap();
        assert_eq!(q.extra_data, b"nonce");
        assert_eq!(q.selected_sha256(), vec![0, 2]);
        use sha2::Digest;
        let want: [u8; 32] = sha2::Sha256::digest([[0u8; 32], [2u8; 32]].concat()).into();
        assert_eq!(q.computed_pcr_digest(), Some(want));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let q = quote(b"n");
        for n in 0..q.len() {
            assert!(TpmQuote::parse(&q[..n]).is_err(), "{n}");
        }
        let mut long = q.clone();
        long.push(0);
        assert!(TpmQuote::parse(&long).is_err());
    }
}
