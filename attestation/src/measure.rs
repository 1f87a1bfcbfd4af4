//! The expected SEV-SNP launch measurement, reproduced from the launch
//! inputs: the firmware (OVMF), and for measured direct boot the kernel,
//! initrd and command line, the vCPU count and type, the VMM and the guest
//! features (SEV-SNP firmware ABI, SNP_LAUNCH_UPDATE; the page-info chain
//! and VMSA layout are the `sev` crate's `measurement` module).
//!
//! A reviewer runs this on inputs built from source and pins the result in
//! a policy; nothing here comes from a running cluster. The firmware is
//! checked first by our own bounds-checked reader of its GUID footer table
//! and SEV metadata (what the `sev` crate would otherwise index without
//! checks), so a malformed image is an error, never a panic.

use std::path::{Path, PathBuf};

use sev::measurement::snp::{snp_calc_launch_digest, SnpMeasurementArgs};
use sev::measurement::vcpu_types::CpuType;
use sev::measurement::vmsa::{GuestFeatures, VMMType};
use sev::parser::ByteParser;

use crate::claims::Measurement;

/// GUID of the table footer at the end of an OVMF image.
pub const FOOTER_GUID: &str = "96b582de-1fb2-45f7-baea-a366c55a082d";
/// GUID of the SEV metadata pointer entry.
pub const SEV_METADATA_GUID: &str = "dc886566-984a-4798-a75e-5585a7bf67cc";
/// GUID of the SEV-ES reset block entry (the APs' reset EIP).
pub const SEV_ES_RESET_BLOCK_GUID: &str = "00f771de-1a7e-4fcb-890e-68c77e2fb44e";
/// GUID of the SEV hash table entry (where the kernel hashes page goes).
pub const SEV_HASH_TABLE_GUID: &str = "7255371f-3a3b-4b04-927b-1da6efa8d454";

/// Bytes of a table entry's trailer: a u16 size, then the GUID.
const ENTRY_HEADER: usize = 18;
/// The table ends this many bytes before the end of the image.
const FOOTER_END_GAP: usize = 32;
/// Bytes of one SEV metadata section descriptor (gpa, size, type: u32 each).
const SECTION_BYTES: usize = 12;
/// Largest firmware image accepted.
pub const MAX_FIRMWARE_BYTES: u64 = 64 << 20;

/// Why a launch measurement could not be computed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MeasureError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The firmware image is not an SEV-SNP capable OVMF.
    #[error("firmware: {0}")]
    Firmware(String),
    /// An argument is out of range or unknown.
    #[error("{0}")]
    Invalid(String),
    /// The `sev` crate refused the inputs.
    #[error("measurement: {0}")]
    Measurement(String),
}

/// Sections of an OVMF image's SEV metadata (type codes of the OVMF spec).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SectionKind {
    /// Pre-validated zero pages.
    SecMem,
    /// The secrets page.
    Secrets,
    /// The CPUID page.
    Cpuid,
    /// The SVSM calling area.
    SvsmCaa,
    /// The page that carries the kernel, initrd and command-line hashes.
    KernelHashes,
}

impl SectionKind {
    fn from_code(code: u32) -> Option<Self> {
        Some(match code {
            1 => Self::SecMem,
            2 => Self::Secrets,
            3 => Self::Cpuid,
            4 => Self::SvsmCaa,
            0x10 => Self::KernelHashes,
            _ => return None,
        })
    }
}

/// One SEV metadata section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    /// Guest physical address.
    pub gpa: u32,
    /// Bytes.
    pub size: u32,
    /// What it holds.
    pub kind: SectionKind,
}

/// What an OVMF image declares for an SNP launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FirmwareLayout {
    /// The APs' reset EIP (SEV-ES reset block).
    pub reset_eip: u32,
    /// SEV metadata sections in order.
    pub sections: Vec<Section>,
    /// Where the kernel hash table lives, when the image supports measured direct boot.
    pub hash_table_gpa: Option<u32>,
}

impl FirmwareLayout {
    /// Whether the image can measure a kernel, initrd and command line.
    pub fn supports_kernel_hashes(&self) -> bool {
        self.hash_table_gpa.is_some() && self.sections.iter().any(|s| s.kind == SectionKind::KernelHashes)
    }
}

/// A GUID (`8-4-4-4-12` hex) as OVMF stores it: the first three fields little-endian.
pub fn guid_le(guid: &str) -> [u8; 16] {
    let hex: String = guid.chars().filter(|c| *c != '-').collect();
    let mut b = [0u8; 16];
    for (i, out) in b.iter_mut().enumerate() {
        *out = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    // The first three fields are stored little-endian.
    b[..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    b
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at.checked_add(4)?)?.try_into().ok()?))
}

/// Reads an OVMF image's GUID footer table and SEV metadata, checking every
/// offset and size against the image.
pub fn check_firmware(image: &[u8]) -> Result<FirmwareLayout, MeasureError> {
    let bad = |m: &str| MeasureError::Firmware(m.to_owned());
    if image.len() < FOOTER_END_GAP + ENTRY_HEADER || !image.len().is_multiple_of(4096) {
        return Err(bad("the image is not a whole number of pages holding a footer table"));
    }
    let footer_at = image.len() - FOOTER_END_GAP - ENTRY_HEADER;
    let footer = &image[footer_at..footer_at + ENTRY_HEADER];
    if footer[2..] != guid_le(FOOTER_GUID) {
        return Err(bad("no OVMF GUID footer table (not an OVMF image)"));
    }
    let table_size = usize::from(u16::from_le_bytes([footer[0], footer[1]]));
    if table_size < ENTRY_HEADER || table_size - ENTRY_HEADER > footer_at {
        return Err(bad("the footer table's size is out of bounds"));
    }
    let table = &image[footer_at - (table_size - ENTRY_HEADER)..footer_at];
    let mut entries: Vec<([u8; 16], &[u8])> = Vec::new();
    let mut end = table.len();
    while end >= ENTRY_HEADER {
        let header = &table[end - ENTRY_HEADER..end];
        let size = usize::from(u16::from_le_bytes([header[0], header[1]]));
        if size < ENTRY_HEADER || size > end {
            return Err(bad("a footer table entry's size is out of bounds"));
        }
        let mut guid = [0u8; 16];
        guid.copy_from_slice(&header[2..]);
        if entries.iter().any(|(g, _)| *g == guid) {
            return Err(bad("a footer table GUID appears twice"));
        }
        entries.push((guid, &table[end - size..end - ENTRY_HEADER]));
        end -= size;
    }
    if end != 0 {
        return Err(bad("the footer table does not divide into entries"));
    }
    let entry = |g: &str| entries.iter().find(|(guid, _)| *guid == guid_le(g)).map(|(_, d)| *d);
    let reset_eip = entry(SEV_ES_RESET_BLOCK_GUID)
        .and_then(|d| u32_at(d, 0))
        .ok_or_else(|| bad("no SEV-ES reset block (the image does not support SEV-ES/SNP)"))?;
    let meta = entry(SEV_METADATA_GUID).ok_or_else(|| bad("no SEV metadata (the image does not support SNP)"))?;
    let from_end = u32_at(meta, 0).ok_or_else(|| bad("the SEV metadata pointer is short"))? as usize;
    let header_at =
        image.len().checked_sub(from_end).ok_or_else(|| bad("the SEV metadata offset is outside the image"))?;
    let header = image.get(header_at..header_at + 16).ok_or_else(|| bad("the SEV metadata header is truncated"))?;
    if &header[..4] != b"ASEV" {
        return Err(bad("the SEV metadata signature is not ASEV"));
    }
    let (size, version, count) = (u32_at(header, 4), u32_at(header, 8), u32_at(header, 12));
    if version != Some(1) {
        return Err(bad("the SEV metadata version is not 1"));
    }
    let count = count.unwrap_or(0) as usize;
    if count == 0 || count > 64 || size != Some((16 + count * SECTION_BYTES) as u32) {
        return Err(bad("the SEV metadata size does not match its section count"));
    }
    let items = image
        .get(header_at + 16..header_at + 16 + count * SECTION_BYTES)
        .ok_or_else(|| bad("the SEV metadata sections run past the image"))?;
    let mut sections = Vec::with_capacity(count);
    for item in items.chunks_exact(SECTION_BYTES) {
        let (gpa, size, code) = (u32_at(item, 0), u32_at(item, 4), u32_at(item, 8));
        let (Some(gpa), Some(size), Some(code)) = (gpa, size, code) else {
            return Err(bad("a truncated SEV metadata section"));
        };
        let kind = SectionKind::from_code(code).ok_or_else(|| bad(&format!("unknown SEV metadata section {code}")))?;
        if !gpa.is_multiple_of(4096) || (size == 0 && kind != SectionKind::Secrets && kind != SectionKind::Cpuid) {
            return Err(bad("an SEV metadata section is not page-aligned or is empty"));
        }
        if u64::from(gpa) + u64::from(size) > 1 << 32 {
            return Err(bad("an SEV metadata section runs past 4 GiB"));
        }
        if kind == SectionKind::KernelHashes && size != 4096 {
            return Err(bad("the kernel hashes section is not one page"));
        }
        sections.push(Section { gpa, size, kind });
    }
    let hash_table_gpa = match entry(SEV_HASH_TABLE_GUID) {
        None => None,
        Some(d) => {
            let gpa = u32_at(d, 0).ok_or_else(|| bad("the SEV hash table entry is short"))?;
            let page = gpa & !0xfff;
            let in_section = sections.iter().any(|s| s.kind == SectionKind::KernelHashes && s.gpa == page);
            // The table (GUID, length, three 50-byte entries) must fit in its page.
            if sections.iter().any(|s| s.kind == SectionKind::KernelHashes) && (!in_section || gpa % 4096 > 4096 - 168)
            {
                return Err(bad("the SEV hash table is not inside the kernel hashes page"));
            }
            Some(gpa)
        }
    };
    Ok(FirmwareLayout { reset_eip, sections, hash_table_gpa })
}

/// The VMM that launches the guest (it decides the VMSA's initial state and
/// how the CPUID page is measured).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vmm {
    /// QEMU/KVM.
    Qemu,
    /// Amazon EC2: refused (see [`launch_digest`]).
    Ec2,
}

impl std::str::FromStr for Vmm {
    type Err = MeasureError;
    fn from_str(s: &str) -> Result<Self, MeasureError> {
        match s.to_ascii_lowercase().as_str() {
            "qemu" => Ok(Vmm::Qemu),
            "ec2" => Ok(Vmm::Ec2),
            other => Err(MeasureError::Invalid(format!("unknown VMM {other:?} (qemu or ec2)"))),
        }
    }
}

/// The inputs of an SNP launch.
#[derive(Clone, Debug)]
pub struct LaunchInputs {
    /// The OVMF image.
    pub ovmf: PathBuf,
    /// Measured direct boot: the kernel.
    pub kernel: Option<PathBuf>,
    /// Measured direct boot: the initrd.
    pub initrd: Option<PathBuf>,
    /// Measured direct boot: the kernel command line.
    pub append: Option<String>,
    /// vCPUs (one VMSA each).
    pub vcpus: u32,
    /// vCPU type as QEMU names it (`EPYC-v4`, `EPYC-Milan`, `EPYC-Genoa`, …).
    pub vcpu_type: String,
    /// The VMM.
    pub vmm: Vmm,
    /// SEV_FEATURES of every VMSA (bit 0, SNPActive, must be set).
    pub guest_features: u64,
}

fn read(path: &Path) -> Result<Vec<u8>, MeasureError> {
    let io = |source| MeasureError::Io { path: path.to_owned(), source };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_FIRMWARE_BYTES {
        return Err(MeasureError::Firmware(format!("{} is larger than {MAX_FIRMWARE_BYTES} bytes", path.display())));
    }
    std::fs::read(path).map_err(io)
}

/// The launch digest an SNP guest started from `inputs` reports as MEASUREMENT.
pub fn launch_digest(inputs: &LaunchInputs) -> Result<Measurement, MeasureError> {
    if inputs.vcpus == 0 || inputs.vcpus > 512 {
        return Err(MeasureError::Invalid("vcpus must be 1..=512".into()));
    }
    if inputs.guest_features & 1 == 0 {
        return Err(MeasureError::Invalid("guest features must set bit 0 (SNPActive)".into()));
    }
    if inputs.kernel.is_none() && (inputs.initrd.is_some() || inputs.append.is_some()) {
        return Err(MeasureError::Invalid("--initrd and --append are measured only with --kernel".into()));
    }
    if inputs.vmm == Vmm::Ec2 {
        // The two public references disagree on EC2's initial VMSA (RDX is 0
        // in the `sev` crate 8.0.0 and 0x600 in sev-snp-measure 0.0.13); one
        // of them prints a value no EC2 guest reports, and we cannot tell
        // which without the hardware. Refuse rather than guess.
        return Err(MeasureError::Invalid(
            "--vmm ec2 is not supported: the sev crate and sev-snp-measure disagree on EC2's initial VMSA (RDX), \
             so neither value can be trusted here; Veil's guests launch under QEMU (deploy/cvm)"
                .into(),
        ));
    }
    let layout = check_firmware(&read(&inputs.ovmf)?)?;
    if inputs.kernel.is_some() && !layout.supports_kernel_hashes() {
        return Err(MeasureError::Firmware(
            "the image has no SNP kernel hashes section: it cannot measure a kernel, initrd and command line".into(),
        ));
    }
    for p in [&inputs.kernel, &inputs.initrd].into_iter().flatten() {
        std::fs::metadata(p).map_err(|source| MeasureError::Io { path: p.clone(), source })?;
    }
    let vcpu_type = CpuType::try_from(inputs.vcpu_type.as_str())
        .map_err(|_| MeasureError::Invalid(format!("unknown vCPU type {:?}", inputs.vcpu_type)))?;
    let guest_features = GuestFeatures::from_bytes(&inputs.guest_features.to_le_bytes())
        .map_err(|e| MeasureError::Invalid(format!("guest features: {e}")))?;
    let args = SnpMeasurementArgs {
        vcpus: inputs.vcpus,
        vcpu_type,
        ovmf_file: inputs.ovmf.clone(),
        guest_features,
        kernel_file: inputs.kernel.clone(),
        initrd_file: inputs.initrd.clone(),
        append: inputs.append.as_deref(),
        ovmf_hash_str: None,
        vmm_type: Some(VMMType::QEMU),
    };
    let digest = snp_calc_launch_digest(args).map_err(|e| MeasureError::Measurement(e.to_string()))?;
    let bytes: Vec<u8> =
        digest.try_into().map_err(|e: sev::error::MeasurementError| MeasureError::Measurement(e.to_string()))?;
    let bytes: [u8; 48] = bytes.try_into().map_err(|_| MeasureError::Measurement("not 48 bytes".into()))?;
    Ok(Measurement(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_are_stored_with_their_first_three_fields_little_endian() {
        assert_eq!(
            guid_le(FOOTER_GUID),
            [0xde, 0x82, 0xb5, 0x96, 0xb2, 0x1f, 0xf7, 0x45, 0xba, 0xea, 0xa3, 0x66, 0xc5, 0x5a, 0x08, 0x2d]
        );
    }

    #[test]
    fn garbage_and_truncated_images_are_errors() {
        assert!(check_firmware(&[]).is_err());
        assert!(check_firmware(&[0u8; 4096]).is_err());
        let mut image = vec![0u8; 4096];
        let at = 4096 - FOOTER_END_GAP - ENTRY_HEADER;
        image[at + 2..at + 18].copy_from_slice(&guid_le(FOOTER_GUID));
        // A table larger than the image.
        image[at..at + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(check_firmware(&image).is_err());
        // An empty table: no reset block.
        image[at..at + 2].copy_from_slice(&(ENTRY_HEADER as u16).to_le_bytes());
        assert!(matches!(check_firmware(&image), Err(MeasureError::Firmware(m)) if m.contains("reset block")));
    }
}
