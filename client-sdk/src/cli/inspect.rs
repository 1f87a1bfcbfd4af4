//! `veil attest inspect`: every field of a report, named and decoded
//! (SEV-SNP reports and bundles; Intel TDX quotes; Azure HCL reports; NVIDIA
//! GPU evidence, one section per GPU).

use serde_json::{json, Value};
use veil_attestation::azure::HclReport;
use veil_attestation::gpu::chain::leaf_fwid;
use veil_attestation::gpu::evidence as gpu_evidence;
use veil_attestation::gpu::spdm::SpdmMeasurements;
use veil_attestation::gpu::GpuEvidence;
use veil_attestation::snp::{Endorsement, Product, RawTcb, SnpReport};
use veil_attestation::tdx::{Quote, TdAttributes};
use veil_attestation::x509::fmt_time;
use veil_attestation::x509::ParsedCert;

use super::{Exit, InspectArgs};
use crate::input::{self, Evidence};

/// Runs the command.
pub fn run(args: &InspectArgs) -> Exit {
    let mut exit = Exit::Accepted;
    if let Some(file) = &args.file {
        let bytes = input::read(file).ok();
        exit = match bytes {
            Some(b) if looks_like_tdx_quote(&b) => run_tdx(&b, args.json),
            Some(b) if b.starts_with(b"HCLA") => run_hcl(&b, args.json),
            _ => run_snp(file, args.json),
        };
    }
    if let Some(path) = &args.gpu_evidence {
        if exit == Exit::Accepted {
            exit = run_gpu(path, args.gpu_certs.as_deref(), args.json);
        }
    }
    exit
}

/// A TDX quote begins with version 4 or 5, key type 2 and TEE type 0x81
/// (little-endian); an SNP report begins with its version (2–5) then the
/// guest SVN, and a bundle or hex text with ASCII.
fn looks_like_tdx_quote(b: &[u8]) -> bool {
    matches!(b, [4 | 5, 0, 2, 0, 0x81, 0, 0, 0, ..])
}

fn run_tdx(bytes: &[u8], as_json: bool) -> Exit {
    let q = match Quote::parse(bytes) {
        Ok(q) => q,
        Err(e) => {
            eprintln!("veil attest inspect: not a TDX quote: {e}");
            return Exit::Unreadable;
        }
    };
    let doc = tdx_json(&q);
    if as_json {
        println!("{}", serde_json::to_string_pretty(&json!({ "tdx_quote": doc })).unwrap_or_default());
    } else {
        let mut out = String::from("Intel TDX quote (UNVERIFIED: decoded, not checked)\n");
        if let Some(map) = doc.as_object() {
            for (key, v) in map {
                write_value(&mut out, key, v, 1);
            }
        }
        print!("{out}");
    }
    Exit::Accepted
}

fn run_hcl(bytes: &[u8], as_json: bool) -> Exit {
    let h = match HclReport::parse(bytes) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("veil attest inspect: not an HCL report: {e}");
            return Exit::Unreadable;
        }
    };
    let claims: Value = serde_json::from_slice(&h.claims_bytes).unwrap_or(Value::Null);
    let snp = SnpReport::from_bytes(&h.snp_report).ok();
    let doc = json!({
        "version": h.version,
        "claims_hash": h.hash.name(),
        "report_data_commits_to_claims": snp.as_ref().map(|r| r.report_data() == h.hash.report_data(&h.claims_bytes)),
        "attestation_key": h.claims.ak_pub().map(|k| format!("RSA-{}", k.bits())).unwrap_or_else(|e| e.reason),
        "snp_report": snp.as_ref().map(|r| json!({
            "version": r.version(),
            "measurement": hex::encode(r.measurement()),
            "report_data": hex::encode(r.report_data()),
        })),
        "runtime_claims": claims,
    });
    if as_json {
        println!("{}", serde_json::to_string_pretty(&json!({ "hcl_report": doc })).unwrap_or_default());
    } else {
        let mut out = String::from("Azure HCL report (UNVERIFIED: decoded, not checked; `veil attest inspect` the SNP report for every field)\n");
        if let Some(map) = doc.as_object() {
            for (key, v) in map {
                write_value(&mut out, key, v, 1);
            }
        }
        print!("{out}");
    }
    Exit::Accepted
}

/// A TDX quote as a JSON document: header, TD report, QE report, PCK chain subjects.
pub fn tdx_json(q: &Quote) -> Value {
    let r = &q.report;
    let attrs = TdAttributes::from_bytes(r.td_attributes);
    let chain: Vec<Value> = ParsedCert::chain_from_pem(&q.pck_chain_pem)
        .map(|c| c.iter().map(|c| json!(c.subject_string())).collect())
        .unwrap_or_else(|e| vec![json!(format!("unparsable: {e}"))]);
    json!({
        "version": q.header.version,
        "body": if q.is_td15() { "TD 1.5" } else { "TD 1.0" },
        "qe_vendor_id": hex::encode(q.header.qe_vendor_id),
        "tee_tcb_svn": hex::encode(r.tee_tcb_svn),
        "tdx_module": format!("version {} SVN {}", r.tee_tcb_svn[1], r.tee_tcb_svn[0]),
        "mr_seam": hex::encode(r.mr_seam),
        "mr_signer_seam": hex::encode(r.mr_signer_seam),
        "seam_attributes": hex::encode(r.seam_attributes),
        "td_attributes": format!("{} ({})", hex::encode(r.td_attributes), attrs.names()),
        "xfam": hex::encode(r.xfam),
        "mr_td": hex::encode(r.mr_td),
        "mr_config_id": hex::encode(r.mr_config_id),
        "mr_owner": hex::encode(r.mr_owner),
        "mr_owner_config": hex::encode(r.mr_owner_config),
        "rtmr0": hex::encode(r.rtmr[0]),
        "rtmr1": hex::encode(r.rtmr[1]),
        "rtmr2": hex::encode(r.rtmr[2]),
        "rtmr3": hex::encode(r.rtmr[3]),
        "report_data": hex::encode(r.report_data),
        "tee_tcb_svn2": r.tee_tcb_svn2.map(hex::encode),
        "mr_service_td": r.mr_service_td.map(hex::encode),
        "qe_report": {
            "mr_enclave": hex::encode(q.qe_report.mr_enclave),
            "mr_signer": hex::encode(q.qe_report.mr_signer),
            "isv_prod_id": q.qe_report.isv_prod_id,
            "isv_svn": q.qe_report.isv_svn,
        },
        "pck_chain": chain,
        "trailing_bytes": q.trailing.len(),
    })
}

fn run_gpu(path: &std::path::Path, certs: Option<&std::path::Path>, as_json: bool) -> Exit {
    let loaded = input::read(path).map_err(|e| e.to_string()).and_then(|bytes| {
        let pem = certs.map(input::read).transpose().map_err(|e| e.to_string())?;
        gpu_evidence::load_any(&bytes, pem.as_deref()).map_err(|e| format!("{}: {e}", path.display()))
    });
    let gpus = match loaded {
        Ok(g) => g,
        Err(e) => {
            eprintln!("veil attest inspect: unreadable input: {e}");
            return Exit::Unreadable;
        }
    };
    let docs: Vec<Value> = gpus.iter().map(gpu_json).collect();
    if as_json {
        println!("{}", serde_json::to_string_pretty(&json!({ "gpus": docs })).unwrap_or_default());
    } else {
        for (i, doc) in docs.iter().enumerate() {
            let mut out = format!("NVIDIA GPU evidence, GPU {i} (UNVERIFIED: decoded, not checked)\n");
            if let Some(map) = doc.as_object() {
                for (key, v) in map {
                    write_value(&mut out, key, v, 1);
                }
            }
            print!("{out}");
        }
    }
    if docs.iter().any(|d| d.get("error").is_some()) {
        Exit::Unreadable
    } else {
        Exit::Accepted
    }
}

/// One GPU's evidence as a JSON document: SPDM fields, opaque data, measurements, chain.
pub fn gpu_json(g: &GpuEvidence) -> Value {
    let chain: Vec<Value> = g
        .cert_chain
        .iter()
        .map(|d| match ParsedCert::from_der(d) {
            Ok(c) => {
                let (nb, na) = c.validity();
                json!({ "subject": c.subject_string(), "not_before": fmt_time(nb), "not_after": fmt_time(na) })
            }
            Err(e) => json!({ "error": e.to_string() }),
        })
        .collect();
    let leaf = g.cert_chain.first().and_then(|d| ParsedCert::from_der(d).ok());
    let mut doc = json!({
        "arch": g.arch,
        "evidence_bytes": g.report.len(),
        "collector_settings": g.settings.map(|s| json!({ "cc_mode": s.cc_mode, "devtools_mode": s.devtools_mode })),
        "certificate_chain": chain,
        "leaf_dice_fwid": leaf.map(|l| leaf_fwid(&l).map(hex::encode).unwrap_or_else(|e| format!("unreadable: {e}"))),
    });
    match SpdmMeasurements::parse(&g.report) {
        Err(e) => doc["error"] = json!(e.to_string()),
        Ok(m) => {
            let (project, project_sku, chip_sku) = m.opaque.board();
            let status = |s: Option<u8>| {
                s.map(|b| match b {
                    0xAA => "0xaa (on)".to_owned(),
                    0x55 => "0x55 (off)".to_owned(),
                    other => format!("{other:#04x}"),
                })
            };
            doc["spdm"] = json!({
                "version": "1.1",
                "request_attributes": format!("{:#04x}", m.request_attributes),
                "measurement_operation": format!("{:#04x}", m.request_operation),
                "slot": m.slot,
                "request_nonce": hex::encode(m.request_nonce),
                "responder_nonce": hex::encode(m.responder_nonce),
                "measurement_blocks": m.blocks.len(),
                "signed_bytes": m.signed_bytes().len(),
                "signature": hex::encode(m.signature),
                "trailing_bytes": m.trailing_bytes,
            });
            doc["opaque"] = json!({
                "driver_version": m.opaque.driver_version(),
                "vbios_version": m.opaque.vbios_version(),
                "project": project,
                "project_sku": project_sku,
                "chip_sku": chip_sku,
                "fwid": m.opaque.fwid().map(hex::encode),
                "nvdec0_status": status(m.opaque.nvdec0_status()),
                "protected_pcie_status": status(m.opaque.protected_pcie_status()),
                "opaque_data_version": m.opaque.opaque_data_version(),
                "feature_flag": m.opaque.feature_flag(),
                "fields": m.opaque.fields.len(),
            });
            // The IDs NVIDIA's RIM service serves this GPU's RIMs under (what a
            // shard's `--gpu-rim` files are fetched by).
            let driver = m.opaque.driver_version();
            let vbios = m.opaque.vbios_version();
            doc["rim_ids"] = json!({
                "driver": driver.as_ref().filter(|_| g.arch == "HOPPER").map(|d| format!("NV_GPU_DRIVER_GH100_{d}")),
                "vbios": match (&project, &project_sku, &chip_sku, &vbios) {
                    (Some(p), Some(s), Some(c), Some(v)) => {
                        Some(format!("NV_GPU_VBIOS_{p}_{s}_{c}_{}", v.replace('.', "").to_uppercase()))
                    }
                    _ => None,
                },
            });
            let blocks: serde_json::Map<String, Value> = m
                .blocks
                .iter()
                .map(|b| {
                    (
                        format!("{:02} (RIM index {})", b.index, u32::from(b.index).saturating_sub(1)),
                        json!(hex::encode(&b.value)),
                    )
                })
                .collect();
            doc["measurements"] = Value::Object(blocks);
        }
    }
    doc
}

fn run_snp(file: &std::path::Path, as_json: bool) -> Exit {
    let args = (file, as_json);
    let (report_bytes, bundle) = match input::load_evidence(args.0) {
        Ok(Evidence::Report(r)) => (r, None),
        Ok(Evidence::Bundle(b)) => (b.report.clone(), Some(*b)),
        Err(e) => {
            eprintln!("veil attest inspect: unreadable input: {e}");
            return Exit::Unreadable;
        }
    };
    let report = match SnpReport::from_bytes(&report_bytes) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("veil attest inspect: {}: not an SEV-SNP report: {e}", args.0.display());
            return Exit::Unreadable;
        }
    };
    let endorsement = bundle.as_ref().map(|b| Endorsement::parse(&b.endorsement));
    let cert_product = endorsement.as_ref().and_then(|e| e.as_ref().ok()).and_then(Endorsement::product);
    let (product, product_source) = match (report.product_hint(), cert_product) {
        (Some(p), _) if report.cpuid().is_some() => (p, "CPUID"),
        (_, Some(p)) => (p, "endorsement"),
        (Some(p), None) => (p, "chip id shape (assumed)"),
        (None, None) => (Product::Milan, "nothing: v2 report without endorsement, Milan/Genoa layout assumed"),
    };
    let mut doc = report_json(&report, product, product_source);
    if let Some(b) = &bundle {
        doc["endorsement"] = match endorsement {
            Some(Ok(e)) => endorsement_json(&e),
            Some(Err(e)) => json!({ "error": e.reason }),
            None => Value::Null,
        };
        doc["chain_certificates"] = json!(b.chain.len());
        doc["crl"] = json!(b.crl.is_some());
        doc["claims"] = serde_json::to_value(&b.claims).unwrap_or(Value::Null);
    }
    if args.1 {
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print!("{}", render_text(&doc));
    }
    Exit::Accepted
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn tcb(raw: RawTcb, product: Product) -> Value {
    let t = raw.decode(product);
    let mut v = json!({
        "raw": format!("{:#018x}", raw.0),
        "bootloader": t.bootloader, "tee": t.tee, "snp": t.snp, "microcode": t.microcode,
    });
    if let Some(fmc) = t.fmc {
        v["fmc"] = json!(fmc);
    }
    v
}

/// The report as a JSON document, fields in ABI order.
pub fn report_json(r: &SnpReport, product: Product, product_source: &str) -> Value {
    let p = r.policy();
    let pi = r.platform_info();
    let ki = r.key_info();
    let mut doc = json!({
        "version": r.version(),
        "guest_svn": r.guest_svn(),
        "policy": {
            "raw": format!("{:#x}", p.0),
            "abi_major": p.abi_major(), "abi_minor": p.abi_minor(),
            "smt_allowed": yes(p.smt_allowed()),
            "reserved_bit17_set": yes(p.reserved_bit_set()),
            "migrate_ma_allowed": yes(p.migrate_ma_allowed()),
            "debug_allowed": yes(p.debug_allowed()),
            "single_socket_required": yes(p.single_socket_required()),
            "cxl_allowed": yes(p.cxl_allowed()),
            "mem_aes_256_xts_required": yes(p.aes_256_xts_required()),
            "rapl_disabled_required": yes(p.rapl_disabled_required()),
            "ciphertext_hiding_required": yes(p.ciphertext_hiding_required()),
            "page_swap_disabled": yes(p.page_swap_disabled()),
        },
        "family_id": hex::encode(r.family_id()),
        "image_id": hex::encode(r.image_id()),
        "vmpl": r.vmpl(),
        "signature_algo": format!("{}{}", r.signature_algo(), if r.signature_algo() == 1 { " (ECDSA P-384 with SHA-384)" } else { " (unknown)" }),
        "tcb_layout": format!("{product} (from {product_source})"),
        "current_tcb": tcb(r.current_tcb(), product),
        "platform_info": {
            "raw": format!("{:#x}", pi.0),
            "smt_enabled": yes(pi.smt_enabled()),
            "tsme_enabled": yes(pi.tsme_enabled()),
            "ecc_enabled": yes(pi.ecc_enabled()),
            "rapl_disabled": yes(pi.rapl_disabled()),
            "ciphertext_hiding_enabled": yes(pi.ciphertext_hiding_enabled()),
            "alias_check_complete": yes(pi.alias_check_complete()),
            "tio_enabled": yes(pi.tio_enabled()),
        },
        "key_info": {
            "raw": format!("{:#x}", ki.0),
            "signing_key": ki.signing_key().to_string(),
            "mask_chip_key": yes(ki.mask_chip_key()),
            "author_key_enabled": yes(ki.author_key_enabled()),
        },
        "report_data": hex::encode(r.report_data()),
        "measurement": hex::encode(r.measurement()),
        "host_data": hex::encode(r.host_data()),
        "id_key_digest": hex::encode(r.id_key_digest()),
        "author_key_digest": hex::encode(r.author_key_digest()),
        "report_id": hex::encode(r.report_id()),
        "report_id_ma": hex::encode(r.report_id_ma()),
        "reported_tcb": tcb(r.reported_tcb(), product),
        "cpuid": match r.cpuid() {
            Some(c) => json!({
                "family": format!("{:#04x}", c.family), "model": format!("{:#04x}", c.model), "stepping": c.stepping,
                "product": Product::from_cpuid(c).map(|p| p.to_string()).unwrap_or_else(|| "unknown".into()),
            }),
            None => json!("absent (report version 2)"),
        },
        "chip_id": if r.chip_id_masked() { "masked (all zero)".to_string() } else { hex::encode(r.chip_id()) },
        "committed_tcb": tcb(r.committed_tcb(), product),
        "current_version": r.current_version().to_string(),
        "committed_version": r.committed_version().to_string(),
        "launch_tcb": tcb(r.launch_tcb(), product),
        "signature": {
            "r": hex::encode(r.signature_r()),
            "s": hex::encode(r.signature_s()),
        },
    });
    if let (Some(l), Some(c)) = (r.launch_mit_vector(), r.current_mit_vector()) {
        doc["launch_mit_vector"] = json!(format!("{l:#x}"));
        doc["current_mit_vector"] = json!(format!("{c:#x}"));
    }
    doc
}

fn endorsement_json(e: &Endorsement) -> Value {
    let (nb, na) = e.cert().validity();
    let t = e.tcb();
    json!({
        "kind": e.kind().to_string(),
        "subject": e.cert().subject_string(),
        "issuer": e.cert().issuer_common_name(),
        "product_name": e.product_name(),
        "not_before": fmt_time(nb),
        "not_after": fmt_time(na),
        "tcb": { "fmc": t.fmc, "bootloader": t.bootloader, "tee": t.tee, "snp": t.snp, "microcode": t.microcode },
        "hw_id": e.hw_id().map(hex::encode),
        "csp_id": e.csp_id(),
        "simulated": veil_attestation::simulated::is_simulated_cert(e.cert()),
    })
}

/// Renders the document as indented `key  value` lines, in field order.
fn render_text(doc: &Value) -> String {
    let mut out = String::from("SEV-SNP attestation report (1184 bytes)\n");
    if let Some(map) = doc.as_object() {
        for (key, v) in map {
            write_value(&mut out, key, v, 1);
        }
    }
    out
}

fn write_value(out: &mut String, key: &str, v: &Value, depth: usize) {
    let pad = "  ".repeat(depth);
    match v {
        Value::Object(m) => {
            out.push_str(&format!("{pad}{key}\n"));
            for (k, inner) in m {
                write_value(out, k, inner, depth + 1);
            }
        }
        Value::String(s) => out.push_str(&format!("{pad}{key:<w$} {s}\n", w = 32usize.saturating_sub(pad.len()))),
        Value::Null => out.push_str(&format!("{pad}{key:<w$} -\n", w = 32usize.saturating_sub(pad.len()))),
        other => out.push_str(&format!("{pad}{key:<w$} {other}\n", w = 32usize.saturating_sub(pad.len()))),
    }
}
