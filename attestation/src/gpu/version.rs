//! Driver and VBIOS versions (a leaf but for `invalid`, itself a leaf: the
//! policy parses its minimums with it).

use crate::invalid::{InvalidValue, ValueKind};
use std::cmp::Ordering;
use std::fmt;

/// A driver or VBIOS version, compared component by component.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    parts: Vec<u32>,
    text: String,
}

impl Version {
    fn parse(text: &str, radix: u32) -> Result<Self, InvalidValue> {
        let not_one = || InvalidValue::new(ValueKind::GpuVersion, format!("{text:?} is not a version"));
        let t = text.trim();
        if t.is_empty() || t.len() > 32 {
            return Err(not_one());
        }
        let parts = t
            .split('.')
            .map(|p| {
                if p.is_empty() || p.len() > 6 {
                    return Err(not_one());
                }
                u32::from_str_radix(p, radix).map_err(|_| not_one())
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { parts, text: t.to_owned() })
    }

    /// Dotted decimal (driver, e.g. `550.90.07`).
    pub fn driver(text: &str) -> Result<Self, InvalidValue> {
        Self::parse(text, 10)
    }

    /// Dotted hex (VBIOS, e.g. `96.00.9F.00.01`).
    pub fn vbios(text: &str) -> Result<Self, InvalidValue> {
        Self::parse(text, 16)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.parts.len().max(other.parts.len());
        let at = |v: &Self, i: usize| v.parts.get(i).copied().unwrap_or(0);
        (0..n).map(|i| at(self, i).cmp(&at(other, i))).find(|o| o.is_ne()).unwrap_or(Ordering::Equal)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}
