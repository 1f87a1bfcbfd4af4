//! Signed notes (C2SP signed-note) with Ed25519 keys: the log's checkpoint
//! signature (type 0x01) and witness cosignatures (C2SP tlog-cosignature,
//! type 0x04).
//!
//! A note is its text (ending in a newline), a blank line, then one line per
//! signature: `— NAME BASE64(KEY_ID ‖ SIGNATURE)`. A key's id is the first
//! four bytes of SHA-256(NAME ‖ "\n" ‖ TYPE ‖ PUBLIC_KEY). Keys are written
//! the way Go's `note` package writes them: `NAME+HEX_ID+BASE64(TYPE ‖ KEY)`
//! for verifiers, with `PRIVATE+KEY+` in front and the 32-byte seed for
//! signers.

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::signature::{Ed25519KeyPair, KeyPair as _, UnparsedPublicKey, ED25519};
use sha2::{Digest as _, Sha256};

use super::LogError;

/// What a key signs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyKind {
    /// A log's checkpoint signature (signed-note type 0x01, Ed25519).
    Log,
    /// A witness's cosignature (tlog-cosignature v1, type 0x04, Ed25519).
    Witness,
}

impl KeyKind {
    fn byte(self) -> u8 {
        match self {
            KeyKind::Log => 0x01,
            KeyKind::Witness => 0x04,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0x01 => Some(KeyKind::Log),
            0x04 => Some(KeyKind::Witness),
            _ => None,
        }
    }
}

fn key_id(name: &str, kind: KeyKind, public: &[u8]) -> [u8; 4] {
    let h = Sha256::new().chain_update(name).chain_update(b"\n").chain_update([kind.byte()]).chain_update(public);
    let h = h.finalize();
    [h[0], h[1], h[2], h[3]]
}

/// A key name: non-empty, no whitespace, no `+`.
fn check_name(name: &str) -> Result<(), LogError> {
    if name.is_empty() || name.contains('+') || name.chars().any(char::is_whitespace) {
        return Err(LogError::Malformed(format!("key name {name:?}: must be non-empty, without spaces or '+'")));
    }
    Ok(())
}

/// A public key that checks note signatures.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoteVerifier {
    name: String,
    kind: KeyKind,
    id: [u8; 4],
    public: [u8; 32],
}

impl NoteVerifier {
    /// Parses `NAME+HEX_ID+BASE64(TYPE ‖ KEY)`.
    pub fn parse(text: &str) -> Result<Self, LogError> {
        let bad = |why: &str| LogError::Malformed(format!("verifier key: {why}"));
        let mut parts = text.trim().splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected NAME+ID+KEY"));
        };
        check_name(name)?;
        let key = B64.decode(key).map_err(|_| bad("the key is not base64"))?;
        let (&kind, public) = key.split_first().ok_or_else(|| bad("empty key"))?;
        let kind =
            KeyKind::from_byte(kind).ok_or_else(|| bad("not an Ed25519 note (0x01) or cosignature (0x04) key"))?;
        let public: [u8; 32] = public.try_into().map_err(|_| bad("an Ed25519 key has 32 bytes"))?;
        let want = key_id(name, kind, &public);
        if hex::encode(want) != id {
            return Err(bad("the key id does not match the name and key"));
        }
        Ok(Self { name: name.to_owned(), kind, id: want, public })
    }

    /// The key's name (a log's origin, a witness's name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the key signs.
    pub fn kind(&self) -> KeyKind {
        self.kind
    }

    /// The Ed25519 public key. One key may be written under several names
    /// (each with its own key id): counting signers means counting these.
    pub fn public_key(&self) -> &[u8; 32] {
        &self.public
    }

    fn checks(&self, message: &[u8], signature: &[u8]) -> bool {
        UnparsedPublicKey::new(&ED25519, &self.public).verify(message, signature).is_ok()
    }
}

impl std::fmt::Display for NoteVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let key = [&[self.kind.byte()][..], &self.public].concat();
        write!(f, "{}+{}+{}", self.name, hex::encode(self.id), B64.encode(key))
    }
}

/// A private key that signs notes.
pub struct NoteSigner {
    verifier: NoteVerifier,
    seed: [u8; 32],
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoteSigner").field("verifier", &self.verifier.to_string()).finish_non_exhaustive()
    }
}

impl NoteSigner {
    /// A fresh key named `name` from the OS's randomness.
    pub fn generate(name: &str, kind: KeyKind) -> Result<Self, LogError> {
        let mut seed = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut seed)
            .map_err(|_| LogError::Malformed("no randomness for a key".into()))?;
        Self::from_seed(name, kind, seed)
    }

    fn from_seed(name: &str, kind: KeyKind, seed: [u8; 32]) -> Result<Self, LogError> {
        check_name(name)?;
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed)
            .map_err(|_| LogError::Malformed("not an Ed25519 seed".into()))?;
        let public: [u8; 32] =
            pair.public_key().as_ref().try_into().map_err(|_| LogError::Malformed("Ed25519 key size".into()))?;
        let verifier = NoteVerifier { name: name.to_owned(), kind, id: key_id(name, kind, &public), public };
        Ok(Self { verifier, seed, pair })
    }

    /// Parses `PRIVATE+KEY+NAME+HEX_ID+BASE64(TYPE ‖ SEED)`.
    pub fn parse(text: &str) -> Result<Self, LogError> {
        let bad = |why: &str| LogError::Malformed(format!("signer key: {why}"));
        let rest = text.trim().strip_prefix("PRIVATE+KEY+").ok_or_else(|| bad("expected PRIVATE+KEY+…"))?;
        let mut parts = rest.splitn(3, '+');
        let (Some(name), Some(id), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected PRIVATE+KEY+NAME+ID+KEY"));
        };
        let key = B64.decode(key).map_err(|_| bad("the key is not base64"))?;
        let (&kind, seed) = key.split_first().ok_or_else(|| bad("empty key"))?;
        let kind = KeyKind::from_byte(kind).ok_or_else(|| bad("not an Ed25519 note or cosignature key"))?;
        let seed: [u8; 32] = seed.try_into().map_err(|_| bad("an Ed25519 seed has 32 bytes"))?;
        let signer = Self::from_seed(name, kind, seed)?;
        if hex::encode(signer.verifier.id) != id {
            return Err(bad("the key id does not match the name and key"));
        }
        Ok(signer)
    }

    /// The private key's text (keep it secret).
    pub fn private_text(&self) -> String {
        let v = &self.verifier;
        let key = [&[v.kind.byte()][..], &self.seed].concat();
        format!("PRIVATE+KEY+{}+{}+{}", v.name, hex::encode(v.id), B64.encode(key))
    }

    /// The public key, for relying parties.
    pub fn verifier(&self) -> &NoteVerifier {
        &self.verifier
    }

    fn sign(&self, message: &[u8]) -> Vec<u8> {
        self.pair.sign(message).as_ref().to_vec()
    }
}

/// A note: its text and its signature lines (name, decoded bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// The signed text, ending in a newline.
    pub text: String,
    /// Each signature line: the signer's name and `KEY_ID ‖ SIGNATURE`.
    pub signatures: Vec<(String, Vec<u8>)>,
}

/// Largest note accepted (a checkpoint with many cosignatures is well below).
pub const MAX_NOTE_BYTES: usize = 64 * 1024;
/// Most signature lines a note may carry.
pub const MAX_SIGNATURES: usize = 100;

impl Note {
    /// Parses a signed note.
    pub fn parse(bytes: &[u8]) -> Result<Self, LogError> {
        let bad = |why: &str| LogError::Malformed(format!("signed note: {why}"));
        if bytes.len() > MAX_NOTE_BYTES {
            return Err(bad("too large"));
        }
        let s = std::str::from_utf8(bytes).map_err(|_| bad("not UTF-8"))?;
        let split = s.rfind("\n\n").ok_or_else(|| bad("no blank line before the signatures"))?;
        let (text, sigs) = (&s[..=split], &s[split + 2..]);
        if !sigs.ends_with('\n') {
            return Err(bad("the last signature line has no newline"));
        }
        let mut signatures = Vec::new();
        for line in sigs.lines() {
            let rest = line.strip_prefix("\u{2014} ").ok_or_else(|| bad("a signature line must start with '— '"))?;
            let (name, sig) = rest.split_once(' ').ok_or_else(|| bad("a signature line is '— NAME SIGNATURE'"))?;
            check_name(name)?;
            let sig = B64.decode(sig).map_err(|_| bad("a signature is not base64"))?;
            if sig.len() < 5 {
                return Err(bad("a signature is shorter than its key id"));
            }
            signatures.push((name.to_owned(), sig));
        }
        if signatures.is_empty() || signatures.len() > MAX_SIGNATURES {
            return Err(bad("a note carries 1 to 100 signatures"));
        }
        Ok(Self { text: text.to_owned(), signatures })
    }

    /// The note with its signature lines.
    pub fn to_text(&self) -> String {
        let mut out = format!("{}\n", self.text);
        for (name, sig) in &self.signatures {
            out += &format!("\u{2014} {name} {}\n", B64.encode(sig));
        }
        out
    }

    fn find<'a>(&'a self, key: &NoteVerifier) -> impl Iterator<Item = &'a [u8]> + 'a {
        let (name, id) = (key.name.clone(), key.id);
        self.signatures.iter().filter(move |(n, s)| *n == name && s[..4] == id).map(|(_, s)| &s[4..])
    }

    /// Signs the text with a log key (type 0x01).
    pub fn sign(text: &str, signer: &NoteSigner) -> Result<Self, LogError> {
        if !text.ends_with('\n') || text.contains("\n\n") {
            return Err(LogError::Malformed("a note's text ends in one newline and has no blank line".into()));
        }
        let sig = [&signer.verifier.id[..], &signer.sign(text.as_bytes())].concat();
        Ok(Self { text: text.to_owned(), signatures: vec![(signer.verifier.name.clone(), sig)] })
    }

    /// Whether a valid type-0x01 signature by `key` is on the note.
    pub fn signed_by(&self, key: &NoteVerifier) -> bool {
        key.kind == KeyKind::Log && self.find(key).any(|sig| key.checks(self.text.as_bytes(), sig))
    }

    /// Adds a witness's cosignature made at `time` (seconds since the epoch).
    pub fn cosign(&mut self, witness: &NoteSigner, time: u64) -> Result<(), LogError> {
        if witness.verifier.kind != KeyKind::Witness {
            return Err(LogError::Malformed("a cosignature needs a witness key (type 0x04)".into()));
        }
        let sig = witness.sign(&cosigned_message(time, &self.text));
        let value = [&witness.verifier.id[..], &time.to_be_bytes(), &sig].concat();
        self.signatures.retain(|(n, s)| !(*n == witness.verifier.name && s[..4] == witness.verifier.id));
        self.signatures.push((witness.verifier.name.clone(), value));
        Ok(())
    }

    /// The time of a valid cosignature by `witness` on this note, if any.
    pub fn cosigned_by(&self, witness: &NoteVerifier) -> Option<u64> {
        if witness.kind != KeyKind::Witness {
            return None;
        }
        self.find(witness).find_map(|value| {
            let (time, sig) = value.split_first_chunk::<8>()?;
            let time = u64::from_be_bytes(*time);
            witness.checks(&cosigned_message(time, &self.text), sig).then_some(time)
        })
    }
}

fn cosigned_message(time: u64, body: &str) -> Vec<u8> {
    format!("cosignature/v1\ntime {time}\n{body}").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_notes_verify_only_with_their_key() {
        let log = NoteSigner::generate("example.org/log", KeyKind::Log).unwrap();
        let again = NoteSigner::parse(&log.private_text()).unwrap();
        assert_eq!(again.verifier(), log.verifier());
        let v = NoteVerifier::parse(&log.verifier().to_string()).unwrap();
        assert_eq!(&v, log.verifier());
        let note = Note::sign("example.org/log\n3\nAAAA\n", &log).unwrap();
        let parsed = Note::parse(note.to_text().as_bytes()).unwrap();
        assert!(parsed.signed_by(&v));
        let other = NoteSigner::generate("example.org/log", KeyKind::Log).unwrap();
        assert!(!parsed.signed_by(other.verifier()));
        let mut edited = parsed.clone();
        edited.text = "example.org/log\n4\nAAAA\n".into();
        assert!(!edited.signed_by(&v));
        // A key id that does not match its name is refused.
        let text = v.to_string().replacen("example.org/log", "example.org/lag", 1);
        assert!(NoteVerifier::parse(&text).is_err());
    }

    #[test]
    fn cosignatures_sign_the_time_and_the_body() {
        let log = NoteSigner::generate("log", KeyKind::Log).unwrap();
        let w = NoteSigner::generate("witness", KeyKind::Witness).unwrap();
        let mut note = Note::sign("log\n1\nAAAA\n", &log).unwrap();
        note.cosign(&w, 1_700_000_000).unwrap();
        let parsed = Note::parse(note.to_text().as_bytes()).unwrap();
        assert_eq!(parsed.cosigned_by(w.verifier()), Some(1_700_000_000));
        assert!(parsed.signed_by(log.verifier()));
        // A log key is not a witness, and an edited time fails.
        assert!(note.cosign(&log, 1).is_err());
        let mut edited = parsed.clone();
        edited.signatures[1].1[4..12].copy_from_slice(&1_700_000_001u64.to_be_bytes());
        assert_eq!(edited.cosigned_by(w.verifier()), None);
    }
}
