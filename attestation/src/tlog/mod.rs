//! A transparency log for signed policy bundles (and the reference values
//! they carry: measurements, manifest roots, peer-policy digests), so that a
//! publisher cannot show one relying party a different bundle than everyone
//! else (a split view) without it being in one public, append-only record.
//!
//! * The tree is RFC 6962's: leaves SHA-256(0x00 ‖ entry), nodes
//!   SHA-256(0x01 ‖ left ‖ right). Tree hashes, inclusion proofs and
//!   consistency proofs come from the `tlog_tiles` crate (Cloudflare's port
//!   of Go's `golang.org/x/mod/sumdb/tlog`, the code behind Go's checksum
//!   database), with its stored-hash layout for the log on disk ([`store`]).
//! * A checkpoint is a C2SP tlog-checkpoint body (origin, size, base64 root)
//!   in a signed note ([`note`]) signed by the log's Ed25519 key; witnesses
//!   add C2SP tlog-cosignature/v1 lines, and a relying party can require N
//!   of a listed set ([`LogTrust`]).
//! * A relying party keeps, per log, the last checkpoint it accepted
//!   ([`LogState`]): a later one must be at least as large and come with a
//!   consistency proof from it, so a rolled-back or forked log is refused.
//!   It also keeps the digest of each bundle version it accepted per
//!   publisher: a different bundle signed with the same version is refused.
//!
//! Pure apart from [`store`]: the caller passes the log's answers in through
//! [`LogSource`] and keeps the state.

pub mod http;
pub mod note;
pub mod store;

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use note::{KeyKind, Note, NoteSigner, NoteVerifier};
pub use tlog_tiles::Hash;

/// Longest proof accepted: a tree of 2^63 entries needs 63 hashes.
pub const MAX_PROOF_HASHES: usize = 64;
/// Largest entry a log takes (a policy bundle is at most 1 MiB).
pub const MAX_ENTRY_BYTES: usize = crate::policy_bundle::MAX_BUNDLE_BYTES;

/// Why a log's answer was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// Not a checkpoint, note, key or proof.
    #[error("transparency log: malformed: {0}")]
    Malformed(String),
    /// The checkpoint does not carry a valid signature of the trusted log key.
    #[error("transparency log: the checkpoint is not signed by the log key {key}")]
    Unsigned {
        /// The trusted log key's name.
        key: String,
    },
    /// Fewer valid cosignatures from the listed witnesses than required.
    #[error("transparency log: {have} of the {need} required witness cosignatures on the checkpoint")]
    Cosignatures {
        /// Valid cosignatures from listed witnesses.
        have: usize,
        /// Required.
        need: usize,
    },
    /// The inclusion proof does not lead to the checkpoint's root.
    #[error("transparency log: the inclusion proof does not verify: the entry is not in the log at size {size}")]
    Inclusion {
        /// The checkpoint's size.
        size: u64,
    },
    /// The log is smaller than when this relying party last accepted it.
    #[error("transparency log: checkpoint size {offered} is below size {seen} already accepted (rollback)")]
    Rollback {
        /// Size accepted before.
        seen: u64,
        /// Size offered now.
        offered: u64,
    },
    /// The log's new checkpoint does not extend the one accepted before.
    #[error("transparency log: checkpoint size {offered} does not extend size {seen} already accepted (a forked log)")]
    Fork {
        /// Size accepted before.
        seen: u64,
        /// Size offered now.
        offered: u64,
    },
    /// A second, different bundle signed with a version already seen.
    #[error(
        "transparency log: publisher {publisher} signed two different bundles as version {version} (a split view)"
    )]
    Equivocation {
        /// The publisher's key hash (hex, shortened).
        publisher: String,
        /// The version.
        version: u64,
    },
    /// The log could not be reached or read.
    #[error("transparency log: {0}")]
    Unavailable(String),
}

impl From<tlog_tiles::Error> for LogError {
    fn from(e: tlog_tiles::Error) -> Self {
        LogError::Malformed(e.to_string())
    }
}

/// RFC 6962's leaf hash of an entry.
pub fn leaf_hash(entry: &[u8]) -> Hash {
    tlog_tiles::record_hash(entry)
}

/// A checkpoint whose signature (and cosignatures, as required) verified.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The log's origin line (its key's name).
    pub origin: String,
    /// Entries in the tree.
    pub size: u64,
    /// The tree's root.
    pub root: Hash,
    /// The signed note as received (with every signature).
    pub note: Note,
}

/// Parses a checkpoint body (origin, size, root, extension lines).
pub fn parse_body(text: &str) -> Result<(String, u64, Hash), LogError> {
    let cp = tlog_tiles::Checkpoint::from_bytes(text.as_bytes())
        .map_err(|_| LogError::Malformed("not a C2SP checkpoint body".into()))?;
    Ok((cp.origin().to_owned(), cp.size(), *cp.hash()))
}

/// The checkpoint body for a tree.
pub fn body(origin: &str, size: u64, root: &Hash) -> Result<String, LogError> {
    let cp = tlog_tiles::Checkpoint::new(origin, size, *root, "")
        .map_err(|_| LogError::Malformed(format!("origin {origin:?} cannot head a checkpoint")))?;
    String::from_utf8(cp.to_bytes()).map_err(|_| LogError::Malformed("checkpoint is not UTF-8".into()))
}

/// What a relying party trusts about a log: its key, and the witnesses of
/// which `required` must have cosigned a checkpoint.
#[derive(Clone, Debug)]
pub struct LogTrust {
    /// The log's checkpoint key (its name is the log's origin).
    pub log: NoteVerifier,
    /// Witness keys (type 0x04).
    pub witnesses: Vec<NoteVerifier>,
    /// How many distinct listed witnesses must have cosigned.
    pub required: usize,
}

impl LogTrust {
    /// Verifies a signed checkpoint: the log key's signature, the origin, and
    /// `required` valid cosignatures from distinct listed witnesses.
    pub fn verify_checkpoint(&self, bytes: &[u8]) -> Result<Checkpoint, LogError> {
        if self.log.kind() != KeyKind::Log {
            return Err(LogError::Malformed("the log key is a witness key".into()));
        }
        if self.required > self.witnesses.len() {
            return Err(LogError::Malformed(format!(
                "{} witness cosignatures required of {} listed witnesses",
                self.required,
                self.witnesses.len()
            )));
        }
        let note = Note::parse(bytes)?;
        if !note.signed_by(&self.log) {
            return Err(LogError::Unsigned { key: self.log.name().to_owned() });
        }
        let (origin, size, root) = parse_body(&note.text)?;
        if origin != self.log.name() {
            return Err(LogError::Malformed(format!("checkpoint of log {origin:?}, expected {:?}", self.log.name())));
        }
        let mut seen: Vec<&NoteVerifier> = Vec::new();
        for w in &self.witnesses {
            if !seen.contains(&w) && note.cosigned_by(w).is_some() {
                seen.push(w);
            }
        }
        if seen.len() < self.required {
            return Err(LogError::Cosignatures { have: seen.len(), need: self.required });
        }
        Ok(Checkpoint { origin, size, root, note })
    }
}

/// Where a relying party gets a log's answers (a directory, a URL).
pub trait LogSource {
    /// The latest signed checkpoint (note bytes).
    fn checkpoint(&self) -> Result<Vec<u8>, LogError>;
    /// The index of the entry with `leaf` hash and its inclusion proof in the tree of `size`.
    fn inclusion(&self, leaf: &Hash, size: u64) -> Result<(u64, Vec<Hash>), LogError>;
    /// The consistency proof from the tree of `old` entries to the tree of `size`.
    fn consistency(&self, old: u64, size: u64) -> Result<Vec<Hash>, LogError>;
    /// Entry `index`.
    fn entry(&self, index: u64) -> Result<Vec<u8>, LogError>;
}

/// Checks that `proof` shows entry `index` with hash `leaf` is in `cp`.
pub fn check_inclusion(cp: &Checkpoint, index: u64, leaf: &Hash, proof: &[Hash]) -> Result<(), LogError> {
    if proof.len() > MAX_PROOF_HASHES || index >= cp.size {
        return Err(LogError::Inclusion { size: cp.size });
    }
    tlog_tiles::check_record(&proof.to_vec(), cp.size, cp.root, index, *leaf)
        .map_err(|_| LogError::Inclusion { size: cp.size })
}

/// Checks that `cp` extends `seen` (`proof` from the log, unused when equal
/// sizes); a smaller `cp` is a rollback.
pub fn check_consistency(seen: &Seen, cp: &Checkpoint, proof: &[Hash]) -> Result<(), LogError> {
    let fork = LogError::Fork { seen: seen.size, offered: cp.size };
    if cp.size < seen.size {
        return Err(LogError::Rollback { seen: seen.size, offered: cp.size });
    }
    if seen.size == 0 {
        return Ok(());
    }
    let root = seen.root()?;
    if cp.size == seen.size {
        return if root == cp.root { Ok(()) } else { Err(fork) };
    }
    if proof.len() > MAX_PROOF_HASHES {
        return Err(fork);
    }
    tlog_tiles::check_tree(&proof.to_vec(), cp.size, cp.root, seen.size, root).map_err(|_| fork)
}

/// A checkpoint a relying party accepted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    /// Entries.
    pub size: u64,
    /// Root, base64 (as in the checkpoint).
    pub root: String,
}

impl Seen {
    fn root(&self) -> Result<Hash, LogError> {
        let bytes = B64.decode(&self.root).map_err(|_| LogError::Malformed("saved root is not base64".into()))?;
        Ok(Hash(bytes.try_into().map_err(|_| LogError::Malformed("saved root is not 32 bytes".into()))?))
    }
}

/// What a relying party remembers between runs (in its state directory).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogState {
    /// The last checkpoint accepted, per log origin.
    #[serde(default)]
    pub logs: BTreeMap<String, Seen>,
    /// SHA-256 (hex) of each bundle accepted, per publisher key hash and version.
    #[serde(default)]
    pub bundles: BTreeMap<String, BTreeMap<u64, String>>,
}

/// An entry found in the log.
#[derive(Clone, Debug)]
pub struct Logged {
    /// The checkpoint it was proven against.
    pub checkpoint: Checkpoint,
    /// Its index.
    pub index: u64,
}

impl LogState {
    /// Requires `entry` to be in the log at its latest checkpoint, verified
    /// with `trust`, and that checkpoint to extend the one accepted before.
    /// Call [`accept`](Self::accept) with the result to remember it.
    pub fn check_logged(&self, entry: &[u8], trust: &LogTrust, source: &dyn LogSource) -> Result<Logged, LogError> {
        let cp = self.check_checkpoint(trust, source)?;
        let leaf = leaf_hash(entry);
        if cp.size == 0 {
            return Err(LogError::Inclusion { size: 0 });
        }
        let (index, proof) = source.inclusion(&leaf, cp.size)?;
        check_inclusion(&cp, index, &leaf, &proof)?;
        Ok(Logged { checkpoint: cp, index })
    }

    /// The log's latest checkpoint, verified with `trust`, and proven to
    /// extend the one accepted before (what a witness checks before it
    /// cosigns, too).
    pub fn check_checkpoint(&self, trust: &LogTrust, source: &dyn LogSource) -> Result<Checkpoint, LogError> {
        let cp = trust.verify_checkpoint(&source.checkpoint()?)?;
        let seen = self.logs.get(&cp.origin).cloned().unwrap_or_default();
        let proof = if seen.size > 0 && cp.size > seen.size { source.consistency(seen.size, cp.size)? } else { vec![] };
        check_consistency(&seen, &cp, &proof)?;
        Ok(cp)
    }

    /// Remembers a checkpoint (only ever moves forward).
    pub fn accept(&mut self, cp: &Checkpoint) {
        let seen = self.logs.entry(cp.origin.clone()).or_default();
        if cp.size >= seen.size {
            *seen = Seen { size: cp.size, root: B64.encode(cp.root.0) };
        }
    }

    /// Refuses a bundle whose publisher already had a different bundle
    /// accepted under the same version.
    pub fn check_bundle(&self, publisher: &str, version: u64, bundle: &[u8]) -> Result<(), LogError> {
        let digest = hex::encode(Sha256::digest(bundle));
        match self.bundles.get(publisher).and_then(|v| v.get(&version)) {
            Some(seen) if *seen != digest => Err(LogError::Equivocation { publisher: short(publisher), version }),
            _ => Ok(()),
        }
    }

    /// Remembers a bundle accepted.
    pub fn accept_bundle(&mut self, publisher: &str, version: u64, bundle: &[u8]) {
        let digest = hex::encode(Sha256::digest(bundle));
        self.bundles.entry(publisher.to_owned()).or_default().insert(version, digest);
    }
}

fn short(publisher: &str) -> String {
    publisher.chars().take(16).collect()
}

/// What an audit of a whole log found.
#[derive(Clone, Debug)]
pub struct Audit {
    /// The checkpoint audited.
    pub checkpoint: Checkpoint,
    /// Policy bundles among the entries that verify with one of the publisher keys given.
    pub bundles: usize,
}

/// Reads every entry of the log, recomputes the checkpoint's root from them,
/// and refuses the log if two different bundles by one of `publishers`
/// carry the same version: what a monitor runs to catch a split view.
pub fn audit(source: &dyn LogSource, trust: &LogTrust, publishers: &[p256::PublicKey]) -> Result<Audit, LogError> {
    let cp = trust.verify_checkpoint(&source.checkpoint()?)?;
    let mut hashes = Vec::new();
    let mut state = LogState::default();
    let mut bundles = 0;
    for i in 0..cp.size {
        let entry = source.entry(i)?;
        let leaf = leaf_hash(&entry);
        store::append_stored(&mut hashes, i, leaf)?;
        if !crate::policy_bundle::is_bundle(&entry) || publishers.is_empty() {
            continue;
        }
        if let Ok(opened) = crate::policy_bundle::open(&entry, publishers, |_| None) {
            let publisher = opened.signer.to_string();
            state.check_bundle(&publisher, opened.version, &entry)?;
            state.accept_bundle(&publisher, opened.version, &entry);
            bundles += 1;
        }
    }
    let root = tlog_tiles::tree_hash(cp.size, &store::Memory(&hashes))?;
    if root != cp.root {
        return Err(LogError::Inclusion { size: cp.size });
    }
    Ok(Audit { checkpoint: cp, bundles })
}

#[cfg(test)]
mod tests {
    use super::store::LogDir;
    use super::*;

    fn tempdir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("veil-tlog-state-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The log as the relying party sees it: a real log directory whose
    /// checkpoint or proofs a hostile operator replaces.
    struct Hostile<'a> {
        log: &'a LogDir,
        checkpoint: Option<Vec<u8>>,
        inclusion: Option<(u64, Vec<Hash>)>,
        consistency: Option<Vec<Hash>>,
    }

    impl<'a> Hostile<'a> {
        fn honest(log: &'a LogDir) -> Self {
            Self { log, checkpoint: None, inclusion: None, consistency: None }
        }
    }

    impl LogSource for Hostile<'_> {
        fn checkpoint(&self) -> Result<Vec<u8>, LogError> {
            self.checkpoint.clone().map_or_else(|| self.log.checkpoint(), Ok)
        }
        fn inclusion(&self, leaf: &Hash, size: u64) -> Result<(u64, Vec<Hash>), LogError> {
            self.inclusion.clone().map_or_else(|| self.log.inclusion(leaf, size), Ok)
        }
        fn consistency(&self, old: u64, size: u64) -> Result<Vec<Hash>, LogError> {
            self.consistency.clone().map_or_else(|| self.log.consistency(old, size), Ok)
        }
        fn entry(&self, index: u64) -> Result<Vec<u8>, LogError> {
            self.log.entry(index)
        }
    }

    fn trust(log: &LogDir) -> LogTrust {
        LogTrust { log: log.verifier().unwrap(), witnesses: vec![], required: 0 }
    }

    #[test]
    fn a_rolled_back_checkpoint_a_tampered_proof_and_an_unlogged_entry_are_refused() {
        let dir = tempdir("rollback");
        let (log, _) = LogDir::create(&dir, "test.example/log").unwrap();
        let trust = trust(&log);
        let mut state = LogState::default();
        log.append(b"bundle 1").unwrap();
        let old = log.checkpoint().unwrap();
        log.append(b"bundle 2").unwrap();
        let logged = state.check_logged(b"bundle 2", &trust, &log).unwrap();
        assert_eq!((logged.index, logged.checkpoint.size), (1, 2));
        state.accept(&logged.checkpoint);
        // The operator serves the older checkpoint (size 1), validly signed.
        let rolled = Hostile { checkpoint: Some(old), ..Hostile::honest(&log) };
        assert!(matches!(
            state.check_logged(b"bundle 1", &trust, &rolled),
            Err(LogError::Rollback { seen: 2, offered: 1 })
        ));
        // A proof with one hash flipped.
        let (i, mut proof) = log.inclusion(&leaf_hash(b"bundle 2"), 2).unwrap();
        proof[0].0[0] ^= 0x80;
        let tampered = Hostile { inclusion: Some((i, proof)), ..Hostile::honest(&log) };
        assert!(matches!(state.check_logged(b"bundle 2", &trust, &tampered), Err(LogError::Inclusion { size: 2 })));
        // An entry that is not in the log; a checkpoint signed by another key.
        assert!(state.check_logged(b"bundle 3", &trust, &log).is_err());
        let other = NoteSigner::generate("test.example/log", KeyKind::Log).unwrap();
        let (_, _, root) = parse_body(&logged.checkpoint.note.text).unwrap();
        let forged = Note::sign(&body("test.example/log", 2, &root).unwrap(), &other).unwrap();
        let forged = Hostile { checkpoint: Some(forged.to_text().into_bytes()), ..Hostile::honest(&log) };
        assert!(matches!(state.check_logged(b"bundle 2", &trust, &forged), Err(LogError::Unsigned { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_client_that_saw_checkpoint_n_refuses_a_log_that_forked_after_it() {
        // Two logs under one key: the same first two entries, then each its own.
        let dir = tempdir("fork");
        let (a, _) = LogDir::create(&dir.join("a"), "test.example/log").unwrap();
        std::fs::create_dir_all(dir.join("b")).unwrap();
        for f in ["log.key", "log.vkey", "checkpoint", "hashes"] {
            std::fs::copy(dir.join("a").join(f), dir.join("b").join(f)).unwrap();
        }
        std::fs::create_dir_all(dir.join("b/entries")).unwrap();
        let b = LogDir::open(&dir.join("b")).unwrap();
        for log in [&a, &b] {
            log.append(b"bundle 1").unwrap();
            log.append(b"bundle 2").unwrap();
        }
        a.append(b"bundle 3").unwrap();
        b.append(b"bundle 3, another").unwrap();
        b.append(b"bundle 4").unwrap();
        let trust = trust(&a);
        let mut state = LogState::default();
        let seen = state.check_logged(b"bundle 3", &trust, &a).unwrap();
        assert_eq!(seen.checkpoint.size, 3);
        state.accept(&seen.checkpoint);
        // Log b is valid on its own (a fresh client takes it) ...
        LogState::default().check_logged(b"bundle 4", &trust, &b).unwrap();
        // ... but not an extension of the checkpoint this client saw.
        assert!(matches!(state.check_logged(b"bundle 4", &trust, &b), Err(LogError::Fork { seen: 3, offered: 4 })));
        // A checkpoint of the size seen (4, log b's) with another root (log a's) is a fork too.
        let mut same = LogState::default();
        same.accept(&b.current().unwrap());
        a.append(b"bundle 5").unwrap();
        let a4 = state.check_logged(b"bundle 5", &trust, &a).unwrap();
        assert_eq!(a4.checkpoint.size, 4);
        assert!(matches!(same.check_logged(b"bundle 5", &trust, &a), Err(LogError::Fork { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cosignature_thresholds_count_only_valid_listed_distinct_witnesses() {
        let dir = tempdir("witness");
        let (log, vkey) = LogDir::create(&dir, "test.example/log").unwrap();
        log.append(b"bundle").unwrap();
        let w: Vec<NoteSigner> =
            (0..3).map(|i| NoteSigner::generate(&format!("witness-{i}"), KeyKind::Witness).unwrap()).collect();
        let outsider = NoteSigner::generate("witness-x", KeyKind::Witness).unwrap();
        let listed: Vec<NoteVerifier> = w.iter().map(|s| s.verifier().clone()).collect();
        let need = |n| LogTrust { log: vkey.clone(), witnesses: listed.clone(), required: n };
        let cosigned = |by: &[&NoteSigner]| {
            let mut note = log.current().unwrap().note;
            for s in by {
                note.cosign(s, 1_750_000_000).unwrap();
            }
            note.to_text().into_bytes()
        };
        need(0).verify_checkpoint(&cosigned(&[])).unwrap();
        // One listed witness and an outsider: 1 of 2.
        let one = cosigned(&[&w[0], &outsider]);
        assert!(matches!(need(2).verify_checkpoint(&one), Err(LogError::Cosignatures { have: 1, need: 2 })));
        need(1).verify_checkpoint(&one).unwrap();
        // The same witness twice counts once.
        let twice = cosigned(&[&w[0], &w[0]]);
        assert!(matches!(need(2).verify_checkpoint(&twice), Err(LogError::Cosignatures { have: 1, need: 2 })));
        need(2).verify_checkpoint(&cosigned(&[&w[0], &w[2]])).unwrap();
        // A cosignature over another checkpoint does not count for this one.
        let mut stale = Note::parse(&cosigned(&[&w[1]])).unwrap();
        log.append(b"bundle 2").unwrap();
        let mut fresh = log.current().unwrap().note;
        fresh.signatures.extend(stale.signatures.drain(1..));
        let fresh = fresh.to_text().into_bytes();
        assert!(matches!(need(1).verify_checkpoint(&fresh), Err(LogError::Cosignatures { have: 0, need: 1 })));
        // More required than listed is a configuration error.
        assert!(matches!(need(4).verify_checkpoint(&one), Err(LogError::Malformed(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn two_bundles_with_one_version_are_refused_by_the_client_and_the_audit() {
        use crate::policy_bundle::PolicySigner;
        let dir = tempdir("equivocation");
        let (log, _) = LogDir::create(&dir, "test.example/log").unwrap();
        let trust = trust(&log);
        let publisher = PolicySigner::generate();
        let a = publisher.sign("allow_smt = false\n", 7).unwrap();
        let b = publisher.sign("allow_smt = true\n", 7).unwrap();
        log.append(&a).unwrap();
        let audit = super::audit(&log, &trust, &[publisher.public_key()]).unwrap();
        assert_eq!((audit.bundles, audit.checkpoint.size), (1, 1));
        let key = crate::policy_bundle::key_hash(&publisher.public_key()).to_string();
        let mut state = LogState::default();
        state.check_bundle(&key, 7, &a).unwrap();
        state.accept_bundle(&key, 7, &a);
        // The operator logs the second bundle too (a split view, now public).
        log.append(&b).unwrap();
        state.check_logged(&b, &trust, &log).unwrap();
        assert!(matches!(state.check_bundle(&key, 7, &b), Err(LogError::Equivocation { version: 7, .. })));
        assert!(matches!(
            super::audit(&log, &trust, &[publisher.public_key()]),
            Err(LogError::Equivocation { version: 7, .. })
        ));
        // The audit recomputes the root: an entry edited on disk is caught.
        std::fs::write(dir.join("entries/000000000000"), b"edited").unwrap();
        assert!(matches!(super::audit(&log, &trust, &[]), Err(LogError::Inclusion { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
