//! SPDM 1.1 `GET_MEASUREMENTS` request ‖ `MEASUREMENTS` response, as NVIDIA
//! GPUs in confidential-computing mode produce it (DMTF DSP0274 1.1.x,
//! §10.11, Tables 47–51), plus NVIDIA's opaque-data TLVs.
//!
//! ```text
//! request (37 bytes)   0x11 ‖ 0xE0 ‖ Param1 (bit 0: signature requested) ‖ Param2 (operation)
//!                      ‖ Nonce[32] ‖ SlotIDParam
//! response             0x11 ‖ 0x60 ‖ Param1 ‖ Param2 ‖ NumberOfBlocks ‖ MeasurementRecordLength (u24 LE)
//!                      ‖ MeasurementRecord ‖ Nonce[32] ‖ OpaqueLength (u16 LE) ‖ OpaqueData
//!                      ‖ Signature[96]   (ECDSA P-384, r ‖ s big-endian)
//! measurement block    Index ‖ MeasurementSpecification (bit 0: DMTF) ‖ MeasurementSize (u16 LE)
//!                      ‖ DMTFSpecMeasurementValueType ‖ DMTFSpecMeasurementValueSize (u16 LE) ‖ value
//! opaque data (NVIDIA) repeated: type (u16 LE) ‖ length (u16 LE) ‖ value
//! ```
//!
//! The parser is sans-IO and total: every length is checked before use and
//! every failure is a typed [`SpdmError`]. The signature is located by the
//! length fields, never as "the last 96 bytes": real evidence has been seen
//! with a trailing byte after the signature. Trailing bytes are not signed;
//! they are counted ([`SpdmMeasurements::trailing_bytes`]) and ignored.

use std::fmt;

/// SPDM version byte this parser speaks (1.1).
pub const SPDM_VERSION_1_1: u8 = 0x11;
/// `GET_MEASUREMENTS` request code (DSP0274 Table 4).
pub const GET_MEASUREMENTS: u8 = 0xE0;
/// `MEASUREMENTS` response code (DSP0274 Table 5).
pub const MEASUREMENTS: u8 = 0x60;
/// Length of the `GET_MEASUREMENTS` request with a nonce and slot id.
pub const REQUEST_LEN: usize = 37;
/// SPDM nonce length.
pub const NONCE_LEN: usize = 32;
/// ECDSA P-384 signature, r ‖ s.
pub const SIGNATURE_LEN: usize = 96;
/// Largest evidence accepted (request ‖ response ‖ trailing bytes).
pub const MAX_EVIDENCE_BYTES: usize = 64 * 1024;
/// Fixed response header: version, code, param1, param2, block count, u24 record length.
pub const RESPONSE_HEADER_LEN: usize = 8;

/// NVIDIA opaque-data field ids (nvtrust `OpaqueData`, NVIDIA attestation SDK).
pub mod field {
    /// Driver version, ASCII, NUL-terminated.
    pub const DRIVER_VERSION: u16 = 3;
    /// GPU info.
    pub const GPU_INFO: u16 = 4;
    /// VBIOS version, 8 bytes (see [`super::OpaqueData::vbios_version`]).
    pub const VBIOS_VERSION: u16 = 6;
    /// NVDEC0 status: 0xAA enabled, 0x55 disabled.
    pub const NVDEC0_STATUS: u16 = 11;
    /// Measurement counts, u32 LE each.
    pub const MEASUREMENT_COUNT: u16 = 12;
    /// Board id.
    pub const BOARD_ID: u16 = 14;
    /// Chip SKU, ASCII.
    pub const CHIP_SKU: u16 = 15;
    /// Chip SKU modifier.
    pub const CHIP_SKU_MOD: u16 = 16;
    /// Board project, ASCII.
    pub const PROJECT: u16 = 17;
    /// Board project SKU, ASCII.
    pub const PROJECT_SKU: u16 = 18;
    /// Project SKU modifier.
    pub const PROJECT_SKU_MOD: u16 = 19;
    /// Firmware id (SHA-384), equal to the leaf certificate's DICE FWID.
    pub const FWID: u16 = 20;
    /// Protected-PCIe status: 0xAA on, 0x55 off.
    pub const PROTECTED_PCIE_STATUS: u16 = 21;
    /// NVSwitch PDIs (multi-GPU protected PCIe).
    pub const SWITCH_PDI: u16 = 22;
    /// Opaque-data format version (u16 LE).
    pub const OPAQUE_DATA_VERSION: u16 = 34;
    /// Feature flag (u16 LE): 0 multi-GPU passthrough CC, 1 single-GPU passthrough CC, 2 protected PCIe.
    pub const FEATURE_FLAG: u16 = 36;
}

/// Status byte meaning "on" in NVIDIA's status fields.
pub const STATUS_ON: u8 = 0xAA;
/// Status byte meaning "off".
pub const STATUS_OFF: u8 = 0x55;

/// Why evidence bytes do not parse as a `GET_MEASUREMENTS` transcript.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpdmError {
    /// More bytes than any real evidence.
    #[error("evidence of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        /// Bytes received.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// A field runs past the end of the evidence.
    #[error("truncated {part} at offset {offset}: needs {need} bytes, {have} left")]
    Truncated {
        /// Which field.
        part: &'static str,
        /// Offset in the evidence.
        offset: usize,
        /// Bytes the field needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// Not SPDM 1.1.
    #[error("{message} has SPDM version {got:#04x}, expected 0x11 (SPDM 1.1)")]
    UnsupportedVersion {
        /// Request or response.
        message: &'static str,
        /// Version byte.
        got: u8,
    },
    /// Not a `GET_MEASUREMENTS` request or `MEASUREMENTS` response.
    #[error("{message} code is {got:#04x}, expected {expected:#04x}")]
    UnexpectedCode {
        /// Request or response.
        message: &'static str,
        /// Expected code.
        expected: u8,
        /// Code found.
        got: u8,
    },
    /// The request did not ask for a signature, so nothing is signed.
    #[error("request attributes {attributes:#04x} do not request a signature")]
    SignatureNotRequested {
        /// Param1 of the request.
        attributes: u8,
    },
    /// NumberOfBlocks is zero.
    #[error("response carries no measurement blocks")]
    NoBlocks,
    /// A block's declared size runs past the measurement record.
    #[error("measurement block #{block} (index {index}) declares {declared} bytes at record offset {offset}, record has {left} left")]
    BlockOverrun {
        /// Position of the block in the record (0-based).
        block: usize,
        /// SPDM index of the block.
        index: u8,
        /// Offset in the record.
        offset: usize,
        /// Declared measurement size.
        declared: usize,
        /// Bytes left in the record.
        left: usize,
    },
    /// A block is not in the DMTF measurement format.
    #[error("measurement block index {index} has specification {spec:#04x}, expected DMTF (0x01)")]
    NotDmtf {
        /// SPDM index.
        index: u8,
        /// MeasurementSpecification byte.
        spec: u8,
    },
    /// A DMTF value size disagrees with its block size.
    #[error("measurement block index {index}: DMTF value size {value_size} + 3 != block size {block_size}")]
    DmtfSizeMismatch {
        /// SPDM index.
        index: u8,
        /// DMTFSpecMeasurementValueSize.
        value_size: usize,
        /// MeasurementSize.
        block_size: usize,
    },
    /// Two blocks claim the same index.
    #[error("measurement index {index} appears twice")]
    DuplicateIndex {
        /// SPDM index.
        index: u8,
    },
    /// Index 0 is reserved, 0xFF means "all" and is not a block index.
    #[error("measurement block index {index} is reserved")]
    ReservedIndex {
        /// SPDM index.
        index: u8,
    },
    /// Blocks parsed do not fill MeasurementRecordLength exactly.
    #[error("measurement record declares {declared} bytes but its {blocks} blocks use {used}")]
    RecordLengthMismatch {
        /// MeasurementRecordLength.
        declared: usize,
        /// Bytes used by the blocks.
        used: usize,
        /// Blocks declared.
        blocks: usize,
    },
    /// An opaque TLV runs past the opaque data.
    #[error("opaque field at opaque offset {offset} (type {field_type}) declares {declared} bytes, {left} left")]
    OpaqueOverrun {
        /// Offset within the opaque data.
        offset: usize,
        /// TLV type, if it could be read.
        field_type: u16,
        /// Declared length.
        declared: usize,
        /// Bytes left.
        left: usize,
    },
    /// A field the verifier interprets appears twice.
    #[error("opaque field {field_type} appears twice")]
    DuplicateOpaqueField {
        /// TLV type.
        field_type: u16,
    },
}

/// One DMTF measurement block.
#[derive(Clone, PartialEq, Eq)]
pub struct MeasurementBlock {
    /// SPDM measurement index (1-based).
    pub index: u8,
    /// DMTFSpecMeasurementValueType.
    pub value_type: u8,
    /// The measurement value (48 bytes of SHA-384 on Hopper).
    pub value: Vec<u8>,
}

impl fmt::Debug for MeasurementBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MeasurementBlock({}: type {:#04x} {})", self.index, self.value_type, hex::encode(&self.value))
    }
}

/// One opaque-data TLV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpaqueField {
    /// Type id (see [`field`]).
    pub field_type: u16,
    /// Value bytes.
    pub value: Vec<u8>,
}

/// NVIDIA's opaque data: TLVs in the order received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpaqueData {
    /// Every field.
    pub fields: Vec<OpaqueField>,
}

/// Ids the verifier interprets; each may appear at most once.
const INTERPRETED: [u16; 11] = [
    field::DRIVER_VERSION,
    field::VBIOS_VERSION,
    field::NVDEC0_STATUS,
    field::CHIP_SKU,
    field::PROJECT,
    field::PROJECT_SKU,
    field::FWID,
    field::PROTECTED_PCIE_STATUS,
    field::OPAQUE_DATA_VERSION,
    field::FEATURE_FLAG,
    field::MEASUREMENT_COUNT,
];

fn ascii(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    bytes[..end].iter().map(|b| if b.is_ascii_graphic() || *b == b' ' { *b as char } else { '?' }).collect()
}

impl OpaqueData {
    /// Parses NVIDIA TLVs (type u16 LE, length u16 LE, value).
    pub fn parse(bytes: &[u8]) -> Result<Self, SpdmError> {
        let mut fields = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let left = bytes.len() - at;
            if left < 4 {
                let field_type = if left >= 2 { u16::from_le_bytes([bytes[at], bytes[at + 1]]) } else { 0 };
                return Err(SpdmError::OpaqueOverrun { offset: at, field_type, declared: 4, left });
            }
            let field_type = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
            let len = usize::from(u16::from_le_bytes([bytes[at + 2], bytes[at + 3]]));
            if len > left - 4 {
                return Err(SpdmError::OpaqueOverrun { offset: at, field_type, declared: len, left: left - 4 });
            }
            if INTERPRETED.contains(&field_type) && fields.iter().any(|f: &OpaqueField| f.field_type == field_type) {
                return Err(SpdmError::DuplicateOpaqueField { field_type });
            }
            fields.push(OpaqueField { field_type, value: bytes[at + 4..at + 4 + len].to_vec() });
            at += 4 + len;
        }
        Ok(Self { fields })
    }

    /// Serialises back to TLVs (used by the simulated attester).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for f in &self.fields {
            out.extend_from_slice(&f.field_type.to_le_bytes());
            // Values longer than u16::MAX cannot be represented; the simulated attester never builds one.
            out.extend_from_slice(&u16::try_from(f.value.len()).unwrap_or(u16::MAX).to_le_bytes());
            out.extend_from_slice(&f.value);
        }
        out
    }

    /// Raw value of a field.
    pub fn get(&self, field_type: u16) -> Option<&[u8]> {
        self.fields.iter().find(|f| f.field_type == field_type).map(|f| f.value.as_slice())
    }

    /// Driver version, e.g. `550.90.07`.
    pub fn driver_version(&self) -> Option<String> {
        self.get(field::DRIVER_VERSION).map(ascii)
    }

    /// VBIOS version as NVIDIA prints it, e.g. `96.00.9F.00.01` (bytes 3.2.1.0.4).
    pub fn vbios_version(&self) -> Option<String> {
        let v = self.get(field::VBIOS_VERSION)?;
        (v.len() >= 5).then(|| format!("{:02X}.{:02X}.{:02X}.{:02X}.{:02X}", v[3], v[2], v[1], v[0], v[4]))
    }

    /// FWID bytes.
    pub fn fwid(&self) -> Option<&[u8]> {
        self.get(field::FWID)
    }

    /// NVDEC0 status byte.
    pub fn nvdec0_status(&self) -> Option<u8> {
        self.get(field::NVDEC0_STATUS).and_then(|v| (v.len() == 1).then(|| v[0]))
    }

    /// Protected-PCIe status byte.
    pub fn protected_pcie_status(&self) -> Option<u8> {
        self.get(field::PROTECTED_PCIE_STATUS).and_then(|v| (v.len() == 1).then(|| v[0]))
    }

    /// Opaque-data version.
    pub fn opaque_data_version(&self) -> Option<u16> {
        self.get(field::OPAQUE_DATA_VERSION).and_then(|v| Some(u16::from_le_bytes(v.try_into().ok()?)))
    }

    /// Feature flag.
    pub fn feature_flag(&self) -> Option<u16> {
        self.get(field::FEATURE_FLAG).and_then(|v| Some(u16::from_le_bytes(v.try_into().ok()?)))
    }

    /// Board project, project SKU and chip SKU (the VBIOS RIM id parts).
    pub fn board(&self) -> (Option<String>, Option<String>, Option<String>) {
        (
            self.get(field::PROJECT).map(ascii),
            self.get(field::PROJECT_SKU).map(ascii),
            self.get(field::CHIP_SKU).map(ascii),
        )
    }
}

/// A parsed `GET_MEASUREMENTS` transcript.
#[derive(Clone, PartialEq, Eq)]
pub struct SpdmMeasurements {
    /// Request Param1 (attributes).
    pub request_attributes: u8,
    /// Request Param2 (measurement operation; 0xFF = all).
    pub request_operation: u8,
    /// The requester's nonce: what binds the evidence to a session.
    pub request_nonce: [u8; NONCE_LEN],
    /// Slot of the certificate chain used.
    pub slot: u8,
    /// Response Param1.
    pub response_param1: u8,
    /// Response Param2.
    pub response_param2: u8,
    /// Measurement blocks in record order.
    pub blocks: Vec<MeasurementBlock>,
    /// The responder's nonce.
    pub responder_nonce: [u8; NONCE_LEN],
    /// NVIDIA opaque data.
    pub opaque: OpaqueData,
    /// r ‖ s, big-endian.
    pub signature: [u8; SIGNATURE_LEN],
    /// Unsigned bytes after the signature.
    pub trailing_bytes: usize,
    signed: Vec<u8>,
}

impl fmt::Debug for SpdmMeasurements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpdmMeasurements")
            .field("request_nonce", &hex::encode(self.request_nonce))
            .field("blocks", &self.blocks.len())
            .field("opaque_fields", &self.opaque.fields.len())
            .field("trailing_bytes", &self.trailing_bytes)
            .finish()
    }
}

/// A bounds-checked cursor.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, part: &'static str, n: usize) -> Result<&'a [u8], SpdmError> {
        let have = self.bytes.len() - self.at;
        if n > have {
            return Err(SpdmError::Truncated { part, offset: self.at, need: n, have });
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }

    fn u8(&mut self, part: &'static str) -> Result<u8, SpdmError> {
        Ok(self.take(part, 1)?[0])
    }

    fn array<const N: usize>(&mut self, part: &'static str) -> Result<[u8; N], SpdmError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(part, N)?);
        Ok(out)
    }
}

fn parse_blocks(record: &[u8], count: usize) -> Result<Vec<MeasurementBlock>, SpdmError> {
    let mut blocks: Vec<MeasurementBlock> = Vec::with_capacity(count);
    let mut at = 0usize;
    for block in 0..count {
        let left = record.len() - at;
        if left < 4 {
            return Err(SpdmError::BlockOverrun { block, index: 0, offset: at, declared: 4, left });
        }
        let index = record[at];
        let spec = record[at + 1];
        let size = usize::from(u16::from_le_bytes([record[at + 2], record[at + 3]]));
        if size > left - 4 {
            return Err(SpdmError::BlockOverrun { block, index, offset: at, declared: size, left: left - 4 });
        }
        if index == 0 || index == 0xFF {
            return Err(SpdmError::ReservedIndex { index });
        }
        if spec & 0x01 == 0 {
            return Err(SpdmError::NotDmtf { index, spec });
        }
        let body = &record[at + 4..at + 4 + size];
        if body.len() < 3 {
            return Err(SpdmError::DmtfSizeMismatch { index, value_size: 0, block_size: size });
        }
        let value_size = usize::from(u16::from_le_bytes([body[1], body[2]]));
        if value_size + 3 != size {
            return Err(SpdmError::DmtfSizeMismatch { index, value_size, block_size: size });
        }
        if blocks.iter().any(|b| b.index == index) {
            return Err(SpdmError::DuplicateIndex { index });
        }
        blocks.push(MeasurementBlock { index, value_type: body[0], value: body[3..].to_vec() });
        at += 4 + size;
    }
    if at != record.len() {
        return Err(SpdmError::RecordLengthMismatch { declared: record.len(), used: at, blocks: count });
    }
    Ok(blocks)
}

impl SpdmMeasurements {
    /// Parses request ‖ response ‖ optional trailing bytes.
    pub fn parse(bytes: &[u8]) -> Result<Self, SpdmError> {
        if bytes.len() > MAX_EVIDENCE_BYTES {
            return Err(SpdmError::TooLarge { len: bytes.len(), max: MAX_EVIDENCE_BYTES });
        }
        let mut c = Cursor { bytes, at: 0 };
        let version = c.u8("request SPDMVersion")?;
        if version != SPDM_VERSION_1_1 {
            return Err(SpdmError::UnsupportedVersion { message: "request", got: version });
        }
        let code = c.u8("request code")?;
        if code != GET_MEASUREMENTS {
            return Err(SpdmError::UnexpectedCode { message: "request", expected: GET_MEASUREMENTS, got: code });
        }
        let request_attributes = c.u8("request Param1")?;
        let request_operation = c.u8("request Param2")?;
        if request_attributes & 0x01 == 0 {
            return Err(SpdmError::SignatureNotRequested { attributes: request_attributes });
        }
        let request_nonce = c.array::<NONCE_LEN>("request nonce")?;
        let slot = c.u8("request SlotIDParam")?;

        let version = c.u8("response SPDMVersion")?;
        if version != SPDM_VERSION_1_1 {
            return Err(SpdmError::UnsupportedVersion { message: "response", got: version });
        }
        let code = c.u8("response code")?;
        if code != MEASUREMENTS {
            return Err(SpdmError::UnexpectedCode { message: "response", expected: MEASUREMENTS, got: code });
        }
        let response_param1 = c.u8("response Param1")?;
        let response_param2 = c.u8("response Param2")?;
        let count = usize::from(c.u8("NumberOfBlocks")?);
        if count == 0 {
            return Err(SpdmError::NoBlocks);
        }
        let len = c.array::<3>("MeasurementRecordLength")?;
        let record_len = usize::from(len[0]) | usize::from(len[1]) << 8 | usize::from(len[2]) << 16;
        let record = c.take("MeasurementRecord", record_len)?;
        let blocks = parse_blocks(record, count)?;
        let responder_nonce = c.array::<NONCE_LEN>("response nonce")?;
        let opaque_len = c.array::<2>("OpaqueLength")?;
        let opaque = OpaqueData::parse(c.take("OpaqueData", usize::from(u16::from_le_bytes(opaque_len)))?)?;
        let signed_end = c.at;
        let signature = c.array::<SIGNATURE_LEN>("Signature")?;
        Ok(Self {
            request_attributes,
            request_operation,
            request_nonce,
            slot,
            response_param1,
            response_param2,
            blocks,
            responder_nonce,
            opaque,
            signature,
            trailing_bytes: bytes.len() - c.at,
            signed: bytes[..signed_end].to_vec(),
        })
    }

    /// Request ‖ response without the signature: what the signature covers.
    pub fn signed_bytes(&self) -> &[u8] {
        &self.signed
    }

    /// The block with SPDM index `index`.
    pub fn block(&self, index: u8) -> Option<&MeasurementBlock> {
        self.blocks.iter().find(|b| b.index == index)
    }
}

/// Builds a transcript in the exact layout (simulated attester, tests, fuzz seeds).
#[derive(Clone, Debug)]
pub struct TranscriptBuilder {
    /// Requester nonce.
    pub request_nonce: [u8; NONCE_LEN],
    /// Blocks, in order.
    pub blocks: Vec<MeasurementBlock>,
    /// Responder nonce.
    pub responder_nonce: [u8; NONCE_LEN],
    /// Opaque data.
    pub opaque: OpaqueData,
}

impl TranscriptBuilder {
    /// Request ‖ response without the signature.
    pub fn signed_part(&self) -> Vec<u8> {
        let mut out = vec![SPDM_VERSION_1_1, GET_MEASUREMENTS, 0x01, 0xFF];
        out.extend_from_slice(&self.request_nonce);
        out.push(0);
        let mut record = Vec::new();
        for b in &self.blocks {
            let size = b.value.len() + 3;
            record.push(b.index);
            record.push(0x01);
            record.extend_from_slice(&u16::try_from(size).unwrap_or(u16::MAX).to_le_bytes());
            record.push(b.value_type);
            record.extend_from_slice(&u16::try_from(b.value.len()).unwrap_or(u16::MAX).to_le_bytes());
            record.extend_from_slice(&b.value);
        }
        out.extend_from_slice(&[SPDM_VERSION_1_1, MEASUREMENTS, 0, 0]);
        out.push(u8::try_from(self.blocks.len()).unwrap_or(u8::MAX));
        let len = u32::try_from(record.len()).unwrap_or(u32::MAX).to_le_bytes();
        out.extend_from_slice(&len[..3]);
        out.extend_from_slice(&record);
        out.extend_from_slice(&self.responder_nonce);
        let opaque = self.opaque.encode();
        out.extend_from_slice(&u16::try_from(opaque.len()).unwrap_or(u16::MAX).to_le_bytes());
        out.extend_from_slice(&opaque);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let b = TranscriptBuilder {
            request_nonce: [7; 32],
            blocks: (1..=4).map(|i| MeasurementBlock { index: i, value_type: 1, value: vec![i; 48] }).collect(),
            responder_nonce: [9; 32],
            opaque: OpaqueData {
                fields: vec![
                    OpaqueField { field_type: field::DRIVER_VERSION, value: b"550.90.07\0".to_vec() },
                    OpaqueField {
                        field_type: field::VBIOS_VERSION,
                        value: vec![0x00, 0x9f, 0x00, 0x96, 0x01, 0, 0, 0],
                    },
                ],
            },
        };
        let mut out = b.signed_part();
        out.extend_from_slice(&[0x5a; SIGNATURE_LEN]);
        out
    }

    #[test]
    fn parses_built_transcript() {
        let raw = sample();
        let m = SpdmMeasurements::parse(&raw).unwrap();
        assert_eq!(m.blocks.len(), 4);
        assert_eq!(m.request_nonce, [7; 32]);
        assert_eq!(m.opaque.driver_version().as_deref(), Some("550.90.07"));
        assert_eq!(m.opaque.vbios_version().as_deref(), Some("96.00.9F.00.01"));
        assert_eq!(m.signed_bytes().len(), raw.len() - SIGNATURE_LEN);
        assert_eq!(m.trailing_bytes, 0);
    }

    #[test]
    fn tolerates_and_counts_trailing_bytes() {
        let mut raw = sample();
        raw.push(0);
        let m = SpdmMeasurements::parse(&raw).unwrap();
        assert_eq!(m.trailing_bytes, 1);
        assert_eq!(m.signature, [0x5a; SIGNATURE_LEN]);
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let raw = sample();
        for len in 0..raw.len() {
            let e = SpdmMeasurements::parse(&raw[..len]).unwrap_err();
            assert!(
                matches!(
                    e,
                    SpdmError::Truncated { .. } | SpdmError::OpaqueOverrun { .. } | SpdmError::BlockOverrun { .. }
                ),
                "{len}: {e}"
            );
        }
    }

    #[test]
    fn refuses_wrong_version_and_codes() {
        let mut raw = sample();
        raw[0] = 0x12;
        assert_eq!(
            SpdmMeasurements::parse(&raw).unwrap_err(),
            SpdmError::UnsupportedVersion { message: "request", got: 0x12 }
        );
        let mut raw = sample();
        raw[1] = 0xE1;
        assert!(matches!(SpdmMeasurements::parse(&raw), Err(SpdmError::UnexpectedCode { got: 0xE1, .. })));
        let mut raw = sample();
        raw[REQUEST_LEN + 1] = 0x7F;
        assert!(matches!(
            SpdmMeasurements::parse(&raw),
            Err(SpdmError::UnexpectedCode { message: "response", got: 0x7F, .. })
        ));
        let mut raw = sample();
        raw[2] = 0;
        assert!(matches!(SpdmMeasurements::parse(&raw), Err(SpdmError::SignatureNotRequested { .. })));
    }

    #[test]
    fn refuses_overrunning_block_and_duplicate_index() {
        let mut raw = sample();
        // First block's MeasurementSize (record offset 2) made huge.
        let first = REQUEST_LEN + RESPONSE_HEADER_LEN;
        raw[first + 2] = 0xFF;
        raw[first + 3] = 0x7F;
        assert!(matches!(SpdmMeasurements::parse(&raw), Err(SpdmError::BlockOverrun { block: 0, index: 1, .. })));
        let mut raw = sample();
        raw[first + 4 + 51] = 1; // second block's index → 1
        assert_eq!(SpdmMeasurements::parse(&raw).unwrap_err(), SpdmError::DuplicateIndex { index: 1 });
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let _ = SpdmMeasurements::parse(&bytes);
            let _ = OpaqueData::parse(&bytes);
        }

        #[test]
        fn mutated_transcripts_never_panic(pos in 0usize..400, byte in proptest::num::u8::ANY) {
            let mut raw = sample();
            let at = pos % raw.len();
            raw[at] = byte;
            let _ = SpdmMeasurements::parse(&raw);
        }
    }
}
