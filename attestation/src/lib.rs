//! # veil-attestation
//!
//! Evidence, verification and policy for Veil's confidential shards.
//!
//! ```text
//!  shard (attester)                      relying party (client / neighbour shard)
//!  ───────────────                       ─────────────────────────────────────────
//!  Claims { tls key, hpke key,           EvidenceBundle (JSON)
//!           manifest, layers, nonce }            │
//!     │ SHA-512(canonical encoding)              ▼
//!     ▼                                   verify(bundle, &Policy, &ExpectedClaims, now)
//!  REPORT_DATA ──▶ AMD-SP signs report      1 report_format      16 measurement …
//!     │            (VCEK, or simulated)     2 product            19 report_data_binding
//!     ▼                                     3 endorsement_chain  20 freshness
//!  EvidenceBundle { report, VCEK, chain,     …                          │
//!                   crl?, claims }                                      ▼
//!                                         Ok(VerifiedEvidence) | Err(Rejected{check, expected, actual})
//! ```
//!
//! Module graph (a DAG): [`check`] (check names, outcomes — PASS, FAIL,
//! WARN, SKIP, NOT RUN, each row flagged when a simulated root chose its
//! values — and the one check table) and the GPU leaves (`gpu::error`,
//! `gpu::report`, which import nothing from [`error`]) ← [`error`] (one
//! [`Rejection`] shape for SNP, GPU and GPU-set failures) ← the SNP checker
//! ([`verify`](mod@verify)'s `chain`, `report` and `binding` checks over [`snp`]) and the
//! GPU checker ([`verify`](mod@verify)'s `gpu` checks over [`gpu`], which parses and
//! imports neither [`error`] nor the policy) ← [`verify::verify_composite`] /
//! [`verify()`], the only place that combines them. The attesters
//! ([`attester`], with the GPUs' in [`attester::gpu`]) sit above the
//! evidence they produce. [`policy`] is a leaf module tree (the
//! policy, its `[platform]` and `[gpu]` sections, the peer-policy gaps).
//! [`nonce_batch`] proves a verifier's nonce is in a batch one evidence
//! answers. [`measure`] reproduces expected launch measurements.
//!
//! * [`verify()`] is pure (no clock, no I/O): the caller passes `now`.
//! * [`VerifiedEvidence`] can only be made by the verifier; RA-TLS links and
//!   sealed requests take it (or a [`ratls::VerifiedPeer`]) as proof.
//! * [`simulated`] evidence is accepted only with `allow_simulated = true`
//!   and is flagged in every check table.
//! * [`ratls`] puts evidence in TLS certificates and verifies it in rustls.
//! * [`gpu`] parses NVIDIA GPU (Hopper) CC evidence; [`verify::verify_gpus`]
//!   checks it, bound to the CPU report through the claims (one table per
//!   GPU); [`attester::gpu`] collects it (simulated, or NVML with `hw`).
//! * [`route`] verifies a whole route as one ([`route::verify_route`]): the
//!   entry's fresh evidence commits to the peer policy every shard enforces,
//!   the route's shape, the exact shards it links and the drafter it
//!   speculates with; every route check runs; only it makes a
//!   [`route::VerifiedRoute`], which sealing a request takes.
//! * [`policy_bundle`] signs and opens versioned policies (a rollback floor
//!   kept by the caller); [`snp::certs`] parses the host's certificate table
//!   with every bound checked.

#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, clippy::panic))]

pub mod attester;
pub mod azure;
pub mod check;
pub mod claims;
pub mod error;
pub mod evidence;
pub mod gpu;
#[cfg(feature = "hw")]
pub mod hw;
pub mod invalid;
pub mod measure;
pub mod merkle;
pub mod nonce_batch;
pub mod policy;
pub mod policy_bundle;
pub mod ratls;
pub mod receipt;
pub mod route;
pub mod simulated;
pub mod snp;
pub mod tdx;
pub mod tlog;
pub mod verify;
pub mod x509;

pub use attester::Attester;
pub use check::{CheckId, CheckReport, GpuCheckId, Outcome};
pub use claims::{
    Claims, DrafterDigest, KeyHash, LayerRange, LinksCommitment, ManifestRoot, Measurement, Nonce, PolicyDigest,
    ReceiptKey, ReportData, RouteDigest,
};
pub use error::{Error, GpuFailure, Malformed, Rejection};
pub use evidence::EvidenceBundle;
pub use invalid::{InvalidValue, ValueKind};
pub use policy::Policy;
pub use simulated::{SimulatedAttester, SimulatedConfig};
pub use verify::{
    appraise, appraise_azure, verify, verify_azure, verify_composite, verify_tdx, AzureAppraisal, ExpectedClaims,
    SnpEndorsement, VerifiedEvidence, VerifiedTdx,
};
