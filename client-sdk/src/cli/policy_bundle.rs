//! Policies from a publisher: `veil policy keygen`, `veil policy sign`, and
//! [`load_policy`], which every command taking `--policy` uses: a TOML file
//! as is, or a signed bundle verified with `--policy-key` against the
//! rollback floor kept in the state directory (SECURITY-CASES C7).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use veil_attestation::policy_bundle::{self, PolicySigner};
use veil_attestation::tlog::store::write_private;
use veil_attestation::Policy;

use super::error::CliError;
use super::{Exit, LogTrustArgs, PolicyKeygenArgs, PolicySignArgs};

/// Where the highest bundle version accepted per publisher is kept:
/// `$VEIL_STATE_DIR`, else `$XDG_STATE_HOME/veil`, else `~/.local/state/veil`.
pub fn state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("VEIL_STATE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("veil");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".local/state/veil")
}

const FLOORS: &str = "policy-versions.json";

/// A rollback-floor file that exists but cannot be used: refused, never
/// read as empty (that would accept any older bundle again).
#[derive(Debug, thiserror::Error)]
#[error(
    "corrupt rollback-floor state (the highest policy bundle version accepted per publisher): {0}; refusing \
     every signed bundle rather than forgetting the floor (restore the file, or delete it to start again as a \
     first use)"
)]
pub struct CorruptFloors(serde_json::Error);

/// The highest version accepted per publisher; none yet when the file does
/// not exist (first use). A file that cannot be read or parsed is an error
/// naming it.
fn read_floors(dir: &Path) -> Result<BTreeMap<String, u64>, CliError> {
    let path = dir.join(FLOORS);
    match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| CliError::malformed(&path)(CorruptFloors(e))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(CliError::read(&path)(e)),
    }
}

fn write_floors(dir: &Path, floors: &BTreeMap<String, u64>) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(CliError::io(dir))?;
    let tmp = dir.join(format!("{FLOORS}.{}", std::process::id()));
    let text = serde_json::to_vec_pretty(floors).map_err(CliError::failed)?;
    std::fs::write(&tmp, text).map_err(CliError::io(&tmp))?;
    std::fs::rename(&tmp, dir.join(FLOORS)).map_err(CliError::io(dir))
}

/// Reads a policy TOML file (no bundle): the one loader for commands that
/// edit or explain a policy file.
pub fn read_toml(path: &Path) -> Result<Policy, CliError> {
    let text = std::fs::read_to_string(path).map_err(CliError::read(path))?;
    Policy::from_toml(&text).map_err(CliError::malformed(path))
}

/// The publisher's public key (`--policy-key`) that the signed bundle at
/// `path` needs.
pub(super) fn publisher_key(path: &Path, key: Option<&Path>) -> Result<p256::PublicKey, CliError> {
    let key = key.ok_or_else(|| {
        CliError::Usage(format!(
            "{} is a signed policy bundle: give the publisher's public key with --policy-key",
            path.display()
        ))
    })?;
    let pem = std::fs::read_to_string(key).map_err(CliError::read(key))?;
    policy_bundle::public_key_from_pem(&pem).map_err(CliError::malformed(key))
}

/// Reads the policy at `path`: TOML, or a signed bundle verified with the
/// public key at `key` (required then) whose version is not below the
/// highest accepted before from that publisher, and which is in the
/// transparency log `log` names (unless `--unlogged`); the floor, the log's
/// checkpoint and the bundle's digest are then kept in the state directory.
pub fn load_policy(path: &Path, key: Option<&Path>, log: &LogTrustArgs) -> Result<Policy, CliError> {
    let bytes = std::fs::read(path).map_err(CliError::read(path))?;
    if !policy_bundle::is_bundle(&bytes) {
        if key.is_some() || log.source.is_some() || log.unlogged {
            return Err(CliError::Usage(format!(
                "{}: --policy-key, --log or --unlogged was given but this policy is not a signed bundle",
                path.display()
            )));
        }
        let text = String::from_utf8(bytes).map_err(|_| CliError::malformed(path)("policy is not UTF-8"))?;
        return Policy::from_toml(&text).map_err(CliError::malformed(path));
    }
    let public = publisher_key(path, key)?;
    let dir = state_dir();
    let mut floors = read_floors(&dir)?;
    let opened = policy_bundle::open(&bytes, &[public], |signer| floors.get(&signer.to_string()).copied())
        .map_err(CliError::malformed(path))?;
    let signer = opened.signer.to_string();
    let logged = if log.unlogged {
        eprintln!(
            "WARNING: policy bundle accepted without a transparency log (--unlogged): a split view would go unseen"
        );
        None
    } else {
        Some(
            super::log::require_logged(&bytes, &signer, opened.version, log, &dir)
                .map_err(CliError::malformed(path))?,
        )
    };
    if floors.get(&signer).is_none_or(|seen| *seen < opened.version) {
        floors.insert(signer.clone(), opened.version);
        write_floors(&dir, &floors)?;
    }
    let where_ =
        logged.map(|l| format!(", in log {} at index {} of {}", l.origin, l.index, l.size)).unwrap_or_default();
    eprintln!("policy bundle version {} from publisher {} (signature verified{where_})", opened.version, &signer[..16]);
    Ok(opened.policy)
}

/// `veil policy keygen --out FILE`
pub fn keygen(args: &PolicyKeygenArgs) -> Exit {
    let signer = PolicySigner::generate();
    let public = args.out.with_extension("pub");
    let result = (|| {
        let private = signer.private_pem().map_err(CliError::failed)?;
        write_private(&args.out, private.as_bytes()).map_err(CliError::io(&args.out))?;
        std::fs::write(&public, signer.public_pem().map_err(CliError::failed)?).map_err(CliError::io(&public))
    })();
    match result {
        Ok(()) => {
            println!("private key {} (keep it offline), public key {}", args.out.display(), public.display());
            Exit::Accepted
        }
        Err(e) => {
            eprintln!("veil policy keygen: {e}");
            Exit::Unreadable
        }
    }
}

/// `veil policy sign POLICY --key KEY --version N --out BUNDLE`
pub fn sign(args: &PolicySignArgs) -> Exit {
    let result = (|| -> Result<Option<(u64, u64)>, CliError> {
        let text = std::fs::read_to_string(&args.policy).map_err(CliError::io(&args.policy))?;
        let pem = std::fs::read_to_string(&args.key).map_err(CliError::io(&args.key))?;
        let signer = PolicySigner::from_pem(&pem).map_err(CliError::malformed(&args.key))?;
        let bundle = signer.sign(&text, args.version).map_err(CliError::malformed(&args.policy))?;
        // Logged first: a bundle the log refuses (another bundle of this
        // version is there) is not handed out either.
        let logged = match &args.log {
            Some(dir) => Some(super::log::append_bundle(dir, &bundle, &signer.public_key())?),
            None => None,
        };
        std::fs::write(&args.out, bundle).map_err(CliError::io(&args.out))?;
        Ok(logged)
    })();
    match result {
        Ok(logged) => {
            println!("signed {} as version {} into {}", args.policy.display(), args.version, args.out.display());
            if let Some((index, size)) = logged {
                println!("appended to the log as entry {index} (checkpoint size {size})");
            }
            Exit::Accepted
        }
        Err(e) => {
            eprintln!("veil policy sign: {e}");
            Exit::Unreadable
        }
    }
}
