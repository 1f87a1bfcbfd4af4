//! Every value parser and constructor of the public API refuses bad input
//! with an `InvalidValue` naming the kind of value, so callers match on the
//! kind and never on the text.

use veil_attestation::gpu::Version;
use veil_attestation::nonce_batch::NoncePath;
use veil_attestation::route::{AttestationDoc, RouteShape, StageShape};
use veil_attestation::snp::endorsement::Endorsement;
use veil_attestation::{Claims, InvalidValue, LayerRange, ManifestRoot, Nonce, ReportData, ValueKind};

fn kind<T: std::fmt::Debug>(r: Result<T, InvalidValue>) -> ValueKind {
    let e = r.unwrap_err();
    // The message names the value and says why.
    assert!(e.to_string().starts_with(&format!("invalid {}: ", e.what)), "{e}");
    assert!(!e.reason.is_empty());
    e.what
}

#[test]
fn each_refusal_names_its_value() {
    assert_eq!(kind(ReportData::from_hex_padded("zz")), ValueKind::ReportData);
    assert_eq!(kind(ReportData::from_hex_padded(&"00".repeat(65))), ValueKind::ReportData);
    assert_eq!(kind(Nonce::new(vec![])), ValueKind::Nonce);
    assert_eq!(kind("not hex".parse::<Nonce>()), ValueKind::Nonce);
    assert_eq!(kind("abcd".parse::<ManifestRoot>()), ValueKind::Digest("ManifestRoot"));
    assert_eq!(kind(LayerRange::new(3, 3)), ValueKind::LayerRange);
    let claims = Claims { software_version: "v".repeat(10_000), ..Claims::default() };
    assert_eq!(kind(claims.report_data()), ValueKind::Claims);
    assert_eq!(kind(claims.gpu_nonce(0)), ValueKind::Claims);
    assert_eq!(kind(veil_attestation::receipt::route_id(&claims)), ValueKind::Claims);
    let stage = |a, b| StageShape { layers: LayerRange::new(a, b).unwrap(), manifest_root: ManifestRoot([0; 32]) };
    assert_eq!(kind(RouteShape::new(30, "f32", vec![stage(0, 10), stage(11, 30)])), ValueKind::RouteShape);
    assert_eq!(kind(RouteShape::new(30, "F-32", vec![stage(0, 30)])), ValueKind::RouteShape);
    assert_eq!(kind(AttestationDoc::from_json(b"{")), ValueKind::AttestationDocument);
    assert_eq!(kind(Version::driver("550.x")), ValueKind::GpuVersion);
    assert_eq!(kind(Version::vbios("")), ValueKind::GpuVersion);
    assert_eq!(kind(Endorsement::parse(b"not a certificate")), ValueKind::Endorsement);
    assert_eq!(kind("1".parse::<veil_attestation::policy::AbiVersion>()), ValueKind::AbiVersion);
    let path = NoncePath { index: 5, size: 2, path: vec![] };
    assert_eq!(kind(path.claimed_nonce(&Nonce::random())), ValueKind::NonceBatch);
}
