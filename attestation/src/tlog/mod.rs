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
    /// The bundle is older than the newest version its publisher logged.
    #[error(
        "transparency log: publisher {publisher} logged version {newest} (entry {index}); this bundle is the older \
         version {version}"
    )]
    Superseded {
        /// The publisher's key hash (hex, shortened).
        publisher: String,
        /// The bundle's version.
        version: u64,
        /// The newest version logged.
        newest: u64,
        /// The newest version's entry.
        index: u64,
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
    /// How many distinct listed witness keys must have cosigned.
    pub required: usize,
}

impl LogTrust {
    /// The distinct public keys among the listed witnesses: one key listed
    /// under two names (two key ids) is one witness.
    pub fn witness_keys(&self) -> Vec<&[u8; 32]> {
        let mut keys: Vec<&[u8; 32]> = Vec::new();
        for w in &self.witnesses {
            if !keys.contains(&w.public_key()) {
                keys.push(w.public_key());
            }
        }
        keys
    }

    /// Verifies a signed checkpoint: the log key's signature, the origin, and
    /// valid cosignatures from `required` distinct listed witness keys (a key
    /// cosigning under two names counts once).
    pub fn verify_checkpoint(&self, bytes: &[u8]) -> Result<Checkpoint, LogError> {
        if self.log.kind() != KeyKind::Log {
            return Err(LogError::Malformed("the log key is a witness key".into()));
        }
        if let Some(w) = self.witnesses.iter().find(|w| w.public_key() == self.log.public_key()) {
            return Err(LogError::Malformed(format!("witness {:?} holds the log's own key", w.name())));
        }
        let keys = self.witness_keys();
        if self.required > keys.len() {
            return Err(LogError::Malformed(format!(
                "{} witness cosignatures required of {} distinct listed witness keys ({} listed)",
                self.required,
                keys.len(),
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
        let mut seen: Vec<&[u8; 32]> = Vec::new();
        for w in &self.witnesses {
            if !seen.contains(&w.public_key()) && note.cosigned_by(w).is_some() {
                seen.push(w.public_key());
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
    /// The highest bundle version each of those publishers (key hash, hex)
    /// logged, with its entry's index.
    pub newest: BTreeMap<String, (u64, u64)>,
}

/// Reads every entry of the log, recomputes the checkpoint's root from them,
/// and refuses the log if two different bundles by one of `publishers`
/// carry the same version: what a monitor runs to catch a split view.
pub fn audit(source: &dyn LogSource, trust: &LogTrust, publishers: &[p256::PublicKey]) -> Result<Audit, LogError> {
    let cp = trust.verify_checkpoint(&source.checkpoint()?)?;
    audit_checkpoint(source, cp, publishers)
}

/// [`audit`] of the tree a checkpoint already verified heads.
fn audit_checkpoint(source: &dyn LogSource, cp: Checkpoint, publishers: &[p256::PublicKey]) -> Result<Audit, LogError> {
    let mut hashes = Vec::new();
    let mut state = LogState::default();
    let mut bundles = 0;
    let mut newest: BTreeMap<String, (u64, u64)> = BTreeMap::new();
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
            let top = newest.entry(publisher).or_insert((opened.version, i));
            if opened.version > top.0 {
                *top = (opened.version, i);
            }
        }
    }
    let root = tlog_tiles::tree_hash(cp.size, &store::Memory(&hashes))?;
    if root != cp.root {
        return Err(LogError::Inclusion { size: cp.size });
    }
    Ok(Audit { checkpoint: cp, bundles, newest })
}

/// A bundle found to be its publisher's newest logged version.
#[derive(Clone, Debug)]
pub struct Newest {
    /// The checkpoint the log was read at.
    pub checkpoint: Checkpoint,
    /// The bundle's index.
    pub index: u64,
    /// Its version (the newest its publisher logged).
    pub version: u64,
}

impl LogState {
    /// Requires `bundle`, signed by `publisher`, to be in the log at its
    /// latest checkpoint (verified with `trust`, extending the one accepted
    /// before) and to carry the highest version that publisher has in the
    /// log: every entry is read and the root recomputed from them (as
    /// [`audit`] does, so two bundles of one version are refused too).
    /// Remembers nothing.
    pub fn check_newest(
        &self,
        bundle: &[u8],
        publisher: &p256::PublicKey,
        trust: &LogTrust,
        source: &dyn LogSource,
    ) -> Result<Newest, LogError> {
        let opened = crate::policy_bundle::open(bundle, &[*publisher], |_| None)
            .map_err(|e| LogError::Malformed(format!("policy bundle: {e}")))?;
        let cp = self.check_checkpoint(trust, source)?;
        let leaf = leaf_hash(bundle);
        if cp.size == 0 {
            return Err(LogError::Inclusion { size: 0 });
        }
        let (index, proof) = source.inclusion(&leaf, cp.size)?;
        check_inclusion(&cp, index, &leaf, &proof)?;
        let audit = audit_checkpoint(source, cp, &[*publisher])?;
        let key = opened.signer.to_string();
        // The bundle is in the audited tree, so its publisher has a newest version there.
        let (newest, newest_index) = audit.newest.get(&key).copied().unwrap_or((opened.version, index));
        if opened.version < newest {
            return Err(LogError::Superseded {
                publisher: short(&key),
                version: opened.version,
                newest,
                index: newest_index,
            });
        }
        Ok(Newest { checkpoint: audit.checkpoint, index, version: opened.version })
    }
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

    /// `signer`'s key under another name (another key id): what a log
    /// operator who runs one witness would publish as a second one.
    /// (A log key becomes a witness key of the same Ed25519 key pair.)
    fn renamed(signer: &NoteSigner, name: &str) -> NoteSigner {
        let text = signer.private_text();
        let key = text.strip_prefix("PRIVATE+KEY+").unwrap().splitn(3, '+').nth(2).unwrap();
        let mut key = B64.decode(key).unwrap();
        key[0] = 0x04;
        let public = signer.verifier().public_key();
        let id = Sha256::new().chain_update(name).chain_update(b"\n").chain_update([0x04]).chain_update(public);
        let text = format!("PRIVATE+KEY+{name}+{}+{}", hex::encode(&id.finalize()[..4]), B64.encode(key));
        NoteSigner::parse(&text).unwrap()
    }

    #[test]
    fn one_key_under_two_names_is_one_witness() {
        let dir = tempdir("one-key-two-names");
        let (log, vkey) = LogDir::create(&dir, "test.example/log").unwrap();
        log.append(b"bundle").unwrap();
        let a = NoteSigner::generate("witness-a.example", KeyKind::Witness).unwrap();
        let b = renamed(&a, "witness-b.example");
        assert_ne!(a.verifier(), b.verifier(), "two names, two key ids");
        assert_eq!(a.verifier().public_key(), b.verifier().public_key());
        let mut note = log.current().unwrap().note;
        note.cosign(&a, 1_750_000_000).unwrap();
        note.cosign(&b, 1_750_000_000).unwrap();
        let note = note.to_text().into_bytes();
        let listed = vec![a.verifier().clone(), b.verifier().clone()];
        let need = |n| LogTrust { log: vkey.clone(), witnesses: listed.clone(), required: n };
        assert_eq!(need(1).witness_keys().len(), 1);
        // Both cosignatures verify, but they are one witness's: 1 required is met, 2 are not.
        need(1).verify_checkpoint(&note).unwrap();
        assert!(matches!(need(2).verify_checkpoint(&note), Err(LogError::Malformed(m)) if m.contains("1 distinct")));
        // With a second, real witness listed, the renamed key still counts once.
        let c = NoteSigner::generate("witness-c.example", KeyKind::Witness).unwrap();
        let three = LogTrust {
            log: vkey.clone(),
            witnesses: [listed.clone(), vec![c.verifier().clone()]].concat(),
            required: 2,
        };
        assert!(matches!(three.verify_checkpoint(&note), Err(LogError::Cosignatures { have: 1, need: 2 })));
        // The log's own key is no witness.
        let own = NoteSigner::parse(&std::fs::read_to_string(dir.join("log.key")).unwrap()).unwrap();
        let as_witness = renamed(&own, "witness-log.example");
        let trust = LogTrust { log: vkey.clone(), witnesses: vec![as_witness.verifier().clone()], required: 1 };
        assert!(matches!(trust.verify_checkpoint(&note), Err(LogError::Malformed(m)) if m.contains("log's own key")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_bundle_older_than_its_publishers_newest_logged_version_is_refused() {
        use crate::policy_bundle::PolicySigner;
        let dir = tempdir("newest");
        let (log, _) = LogDir::create(&dir, "test.example/log").unwrap();
        let trust = trust(&log);
        let publisher = PolicySigner::generate();
        let other = PolicySigner::generate();
        let v: Vec<Vec<u8>> =
            (1..=3).map(|n| publisher.sign(&format!("# v{n}\nallow_smt = false\n"), n).unwrap()).collect();
        log.append(&v[0]).unwrap();
        log.append(&v[1]).unwrap();
        let before_v3 = log.checkpoint().unwrap();
        log.append(&v[2]).unwrap();
        // Another publisher's higher version does not count against this one's.
        log.append(&other.sign("allow_smt = false\n", 9).unwrap()).unwrap();
        let state = LogState::default();
        let key = publisher.public_key();
        assert!(matches!(
            state.check_newest(&v[0], &key, &trust, &log),
            Err(LogError::Superseded { version: 1, newest: 3, index: 2, .. })
        ));
        let newest = state.check_newest(&v[2], &key, &trust, &log).unwrap();
        assert_eq!((newest.index, newest.version, newest.checkpoint.size), (2, 3, 4));
        // A version 4 that was never logged is refused as not in the log.
        let v4 = publisher.sign("allow_smt = false\n", 4).unwrap();
        assert!(matches!(state.check_newest(&v4, &key, &trust, &log), Err(LogError::Inclusion { size: 4 })));
        // The operator serves its checkpoint from before version 3: a client
        // that saw the larger log refuses it; a fresh one cannot tell (without
        // witnesses required, THREAT_MODEL §4.12).
        let rolled = Hostile { checkpoint: Some(before_v3), ..Hostile::honest(&log) };
        let mut seen = LogState::default();
        seen.accept(&log.current().unwrap());
        assert!(matches!(
            seen.check_newest(&v[1], &key, &trust, &rolled),
            Err(LogError::Rollback { seen: 4, offered: 2 })
        ));
        state.check_newest(&v[1], &key, &trust, &rolled).unwrap();
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
