//! A log kept in a directory:
//!
//! ```text
//! DIR/log.key        the log's private key (mode 0600; appends only)
//! DIR/log.vkey       its verifier key, for relying parties
//! DIR/checkpoint     the latest signed checkpoint (with cosignatures)
//! DIR/hashes         the stored hashes (tlog's layout, 32 bytes each)
//! DIR/entries/N      entry N as appended
//! ```
//!
//! The checkpoint is the commit point: an append writes the entry and its
//! stored hashes first, then replaces the checkpoint; hashes past the
//! checkpoint's size left by an interrupted append are cut before the next.
//! One appender at a time (a lock file); readers need no lock.

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};

use tlog_tiles::{HashReader, HASH_SIZE};

use super::{body, leaf_hash, Checkpoint, Hash, LogError, LogSource, Note, NoteSigner, NoteVerifier, MAX_ENTRY_BYTES};

/// Stored hashes in memory (an audit's, a test's).
pub(crate) struct Memory<'a>(pub(crate) &'a [Hash]);

impl HashReader for Memory<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        indexes
            .iter()
            .map(|&i| self.0.get(usize::try_from(i).unwrap_or(usize::MAX)).copied())
            .collect::<Option<Vec<_>>>()
            .ok_or(tlog_tiles::Error::IndexesNotInTree)
    }
}

/// Appends entry `n`'s stored hashes to `hashes` (which holds those of entries `0..n`).
pub(crate) fn append_stored(hashes: &mut Vec<Hash>, n: u64, leaf: Hash) -> Result<(), LogError> {
    let new = tlog_tiles::stored_hashes_for_record_hash(n, leaf, &Memory(hashes))?;
    hashes.extend(new);
    Ok(())
}

/// A log directory.
#[derive(Debug, Clone)]
pub struct LogDir {
    dir: PathBuf,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> LogError + '_ {
    move |e| LogError::Unavailable(format!("{}: {e}", path.display()))
}

struct Lock(PathBuf);

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

struct FileHashes<'a>(&'a Path);

impl HashReader for FileHashes<'_> {
    fn read_hashes(&self, indexes: &[u64]) -> Result<Vec<Hash>, tlog_tiles::Error> {
        let mut f = std::fs::File::open(self.0).map_err(|_| tlog_tiles::Error::IndexesNotInTree)?;
        let mut out = Vec::with_capacity(indexes.len());
        for &i in indexes {
            let mut h = [0u8; HASH_SIZE];
            f.seek(SeekFrom::Start(i * HASH_SIZE as u64)).map_err(|_| tlog_tiles::Error::IndexesNotInTree)?;
            f.read_exact(&mut h).map_err(|_| tlog_tiles::Error::IndexesNotInTree)?;
            out.push(Hash(h));
        }
        Ok(out)
    }
}

impl LogDir {
    /// Creates an empty log named `origin` in `dir` (which must not hold one)
    /// with a fresh key, and signs its first checkpoint (size 0).
    pub fn create(dir: &Path, origin: &str) -> Result<(Self, NoteVerifier), LogError> {
        let log = Self { dir: dir.to_owned() };
        if log.path("checkpoint").exists() {
            return Err(LogError::Malformed(format!("{} already holds a log", dir.display())));
        }
        let signer = NoteSigner::generate(origin, super::KeyKind::Log)?;
        std::fs::create_dir_all(log.path("entries")).map_err(io(dir))?;
        let key = log.path("log.key");
        write_private(&key, signer.private_text().as_bytes()).map_err(io(&key))?;
        let vkey = signer.verifier().clone();
        write_atomic(&log.path("log.vkey"), format!("{vkey}\n").as_bytes())?;
        std::fs::write(log.path("hashes"), b"").map_err(io(dir))?;
        let note = Note::sign(&body(origin, 0, &tlog_tiles::EMPTY_HASH)?, &signer)?;
        write_atomic(&log.path("checkpoint"), note.to_text().as_bytes())?;
        Ok((log, vkey))
    }

    /// An existing log.
    pub fn open(dir: &Path) -> Result<Self, LogError> {
        let log = Self { dir: dir.to_owned() };
        if !log.path("checkpoint").is_file() {
            return Err(LogError::Unavailable(format!("{}: no log here (veil log init)", dir.display())));
        }
        Ok(log)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn entry_path(&self, index: u64) -> PathBuf {
        self.dir.join("entries").join(format!("{index:012}"))
    }

    /// The log's verifier key.
    pub fn verifier(&self) -> Result<NoteVerifier, LogError> {
        let p = self.path("log.vkey");
        NoteVerifier::parse(&std::fs::read_to_string(&p).map_err(io(&p))?)
    }

    /// The current checkpoint (its own signature checked).
    pub fn current(&self) -> Result<Checkpoint, LogError> {
        let trust = super::LogTrust { log: self.verifier()?, witnesses: vec![], required: 0 };
        trust.verify_checkpoint(&self.checkpoint()?)
    }

    /// The index of the first entry with `leaf` hash below `size`.
    pub fn find(&self, leaf: &Hash, size: u64) -> Result<Option<u64>, LogError> {
        let path = self.path("hashes");
        let stored = std::fs::read(&path).map_err(io(&path))?;
        Ok((0..size).find(|&i| {
            let at = usize::try_from(tlog_tiles::stored_hash_index(0, i)).unwrap_or(usize::MAX);
            stored.get(at.saturating_mul(HASH_SIZE)..at.saturating_add(1).saturating_mul(HASH_SIZE))
                == Some(&leaf.0[..])
        }))
    }

    /// Appends `entry`, signs the new checkpoint and returns its index; an
    /// entry already in the log is not added again (its index is returned).
    pub fn append(&self, entry: &[u8]) -> Result<(u64, Checkpoint), LogError> {
        if entry.len() > MAX_ENTRY_BYTES {
            return Err(LogError::Malformed(format!("entry of {} bytes exceeds {MAX_ENTRY_BYTES}", entry.len())));
        }
        let lock_path = self.path("lock");
        std::fs::OpenOptions::new().write(true).create_new(true).open(&lock_path).map_err(|e| {
            LogError::Unavailable(format!("{}: another append holds the lock ({e})", lock_path.display()))
        })?;
        let _lock = Lock(lock_path);
        let key = self.path("log.key");
        let signer = NoteSigner::parse(&std::fs::read_to_string(&key).map_err(io(&key))?)?;
        let cp = self.current()?;
        let leaf = leaf_hash(entry);
        if let Some(index) = self.find(&leaf, cp.size)? {
            return Ok((index, cp));
        }
        let n = cp.size;
        let hashes = self.path("hashes");
        // Cut what an interrupted append left past the checkpoint.
        let keep = tlog_tiles::stored_hash_count(n) * HASH_SIZE as u64;
        let mut f = std::fs::OpenOptions::new().write(true).open(&hashes).map_err(io(&hashes))?;
        f.set_len(keep).map_err(io(&hashes))?;
        let stored = tlog_tiles::stored_hashes_for_record_hash(n, leaf, &FileHashes(&hashes))?;
        let entry_path = self.entry_path(n);
        std::fs::write(&entry_path, entry).map_err(io(&entry_path))?;
        f.seek(SeekFrom::Start(keep)).map_err(io(&hashes))?;
        for h in &stored {
            f.write_all(&h.0).map_err(io(&hashes))?;
        }
        f.sync_all().map_err(io(&hashes))?;
        let root = tlog_tiles::tree_hash(n + 1, &FileHashes(&hashes))?;
        let note = Note::sign(&body(&cp.origin, n + 1, &root)?, &signer)?;
        write_atomic(&self.path("checkpoint"), note.to_text().as_bytes())?;
        Ok((n, Checkpoint { origin: cp.origin, size: n + 1, root, note }))
    }

    /// Replaces the checkpoint with the same one carrying more cosignatures
    /// (a witness's); refuses a note whose text is not the current checkpoint's.
    pub fn add_cosignatures(&self, note: &Note) -> Result<(), LogError> {
        let mut current = self.current()?.note;
        if current.text != note.text {
            return Err(LogError::Malformed("the cosigned checkpoint is not the log's current one".into()));
        }
        for sig in &note.signatures {
            if !current.signatures.contains(sig) {
                current.signatures.push(sig.clone());
            }
        }
        write_atomic(&self.path("checkpoint"), current.to_text().as_bytes())
    }
}

impl LogSource for LogDir {
    fn checkpoint(&self) -> Result<Vec<u8>, LogError> {
        let p = self.path("checkpoint");
        std::fs::read(&p).map_err(io(&p))
    }

    fn inclusion(&self, leaf: &Hash, size: u64) -> Result<(u64, Vec<Hash>), LogError> {
        let index = self.find(leaf, size)?.ok_or(LogError::Inclusion { size })?;
        Ok((index, tlog_tiles::prove_record(size, index, &FileHashes(&self.path("hashes")))?))
    }

    fn consistency(&self, old: u64, size: u64) -> Result<Vec<Hash>, LogError> {
        Ok(tlog_tiles::prove_tree(size, old, &FileHashes(&self.path("hashes")))?)
    }

    fn entry(&self, index: u64) -> Result<Vec<u8>, LogError> {
        let p = self.entry_path(index);
        std::fs::read(&p).map_err(io(&p))
    }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), LogError> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Writes a new private key file readable by its owner only (mode 0600;
/// an existing file is an error, never overwritten).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    fn tempdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("veil-tlog-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn every_inclusion_and_consistency_proof_verifies_and_a_tampered_one_fails() {
        let dir = tempdir("proofs");
        let (log, vkey) = LogDir::create(&dir, "test.example/log").unwrap();
        let trust = LogTrust { log: vkey, witnesses: vec![], required: 0 };
        let mut checkpoints = vec![log.current().unwrap()];
        for i in 0..13u32 {
            let (index, cp) = log.append(format!("entry {i}").as_bytes()).unwrap();
            assert_eq!(index, u64::from(i));
            assert_eq!(trust.verify_checkpoint(&log.checkpoint().unwrap()).unwrap(), cp);
            checkpoints.push(cp);
        }
        // The same entry again is not a new one.
        assert_eq!(log.append(b"entry 3").unwrap().0, 3);
        // The root agrees with the plain RFC 6962 recursion.
        let leaves: Vec<[u8; 32]> = (0..13).map(|i| leaf_hash(format!("entry {i}").as_bytes()).0).collect();
        assert_eq!(checkpoints[13].root.0, crate::merkle::root(&leaves));
        for cp in &checkpoints[1..] {
            for i in 0..cp.size {
                let leaf = leaf_hash(format!("entry {i}").as_bytes());
                let proof = tlog_tiles::prove_record(cp.size, i, &FileHashes(&log.path("hashes"))).unwrap();
                check_inclusion(cp, i, &leaf, &proof).unwrap();
                // Another leaf, another index, or one hash flipped: refused.
                assert!(check_inclusion(cp, i, &leaf_hash(b"entry x"), &proof).is_err());
                if cp.size > 1 {
                    assert!(check_inclusion(cp, (i + 1) % cp.size, &leaf, &proof).is_err());
                    let mut bad = proof.clone();
                    bad[0].0[7] ^= 1;
                    assert!(matches!(check_inclusion(cp, i, &leaf, &bad), Err(LogError::Inclusion { .. })));
                }
            }
            for old in &checkpoints[1..] {
                let seen = Seen { size: old.size, root: B64.encode(old.root.0) };
                if old.size > cp.size {
                    assert!(matches!(check_consistency(&seen, cp, &[]), Err(LogError::Rollback { .. })));
                    continue;
                }
                let proof = log.consistency(old.size, cp.size).unwrap();
                check_consistency(&seen, cp, &proof).unwrap();
                if !proof.is_empty() {
                    let mut bad = proof.clone();
                    bad[proof.len() - 1].0[0] ^= 1;
                    assert!(matches!(check_consistency(&seen, cp, &bad), Err(LogError::Fork { .. })));
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_interrupted_append_is_cut_and_the_log_goes_on() {
        let dir = tempdir("interrupted");
        let (log, _) = LogDir::create(&dir, "test.example/log").unwrap();
        log.append(b"a").unwrap();
        // Stray hashes past the checkpoint (a crash after writing them).
        let mut f = std::fs::OpenOptions::new().append(true).open(log.path("hashes")).unwrap();
        f.write_all(&[9u8; 64]).unwrap();
        let (i, cp) = log.append(b"b").unwrap();
        assert_eq!(i, 1);
        assert_eq!(cp.root.0, crate::merkle::root(&[leaf_hash(b"a").0, leaf_hash(b"b").0]));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
