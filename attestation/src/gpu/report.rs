//! The GPU tables: one [`CheckTable`] per GPU (the same table the SNP
//! checks fill), and the appraisal of a shard's whole GPU set.

use std::fmt;
use std::ops::{Deref, DerefMut};

use serde::Serialize;

use super::error::GpuError;
use crate::check::{CheckRow, CheckTable, GpuCheckId};

/// One row of a GPU table.
pub type GpuCheckResult = CheckRow<GpuCheckId, GpuError>;

/// Every check of one GPU with its outcome.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuCheckReport {
    /// Position of the GPU in the shard's evidence (the nonce derivation index).
    pub gpu_index: u32,
    /// The rows and warnings.
    #[serde(flatten)]
    pub table: CheckTable<GpuCheckId, GpuError>,
}

impl Deref for GpuCheckReport {
    type Target = CheckTable<GpuCheckId, GpuError>;
    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

impl DerefMut for GpuCheckReport {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.table
    }
}

impl fmt::Display for GpuCheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "GPU {}", self.gpu_index)?;
        write!(f, "{}", self.table)
    }
}

/// Result of appraising a shard's GPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GpuAppraisal {
    /// Set-level failure (GPU evidence required but absent, wrong count, a GPU twice).
    pub topology: Option<(String, String)>,
    /// The typed set-level error.
    #[serde(skip)]
    pub topology_error: Option<GpuError>,
    /// One table per GPU.
    pub gpus: Vec<GpuCheckReport>,
}

impl GpuAppraisal {
    /// Whether every GPU passed and the set is as the policy requires.
    pub fn accepted(&self) -> bool {
        self.topology.is_none() && self.gpus.iter().all(|g| g.accepted())
    }
}

impl fmt::Display for GpuAppraisal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some((expected, actual)) = &self.topology {
            writeln!(f, "GPU set: FAIL expected {expected}; got {actual}")?;
        }
        for (i, g) in self.gpus.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            writeln!(f, "{g}")?;
        }
        Ok(())
    }
}
