//! Weight matrices as a slice holds them (Veil's fused kernels where they
//! have one, candle's quantized matmul otherwise), projections that share
//! an input, and the loader that reads each tensor once, hashes it and
//! records it in the manifest.

use std::sync::Arc;

use candle_core::quantized::{ggml_file, GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::error::{ModelError, Result};
use super::gguf::{GgufFile, RawTensor, TensorType};
use super::kernels::expanded::ExpandedMatrix;
use super::kernels::kquant::KQuantMatrix;
use super::kernels::q5_1::Q51Matrix;
use super::kernels::{KernelError, Q41Matrix, Q80Matrix};
use super::manifest::TensorRecord;
use super::quant::GgmlType;

pub(crate) struct Loader<'a> {
    pub(crate) gguf: &'a mut GgufFile,
    pub(crate) records: Vec<TensorRecord>,
    pub(crate) progress: Option<indicatif::ProgressBar>,
    /// Where matrices go: `None` for the fused CPU kernels, else a candle device.
    pub(crate) device: Option<Device>,
    /// The token embedding as read, kept for a tied LM head on a device.
    pub(crate) tied: Option<RawTensor>,
}

impl Loader<'_> {
    pub(crate) fn raw(&mut self, name: &str) -> Result<RawTensor> {
        self.raw_keeping(name, &[])
    }

    /// [`Self::raw`], keeping a matrix as stored where Veil's CPU kernels
    /// run its type packed (candle does not decode it): IQ4_NL and IQ4_XS.
    pub(crate) fn matrix_raw(&mut self, name: &str) -> Result<RawTensor> {
        self.raw_keeping(name, if self.device.is_none() { &KEPT_PACKED } else { &[] })
    }

    fn raw_keeping(&mut self, name: &str, packed: &[GgmlType]) -> Result<RawTensor> {
        let raw = self.gguf.load_raw_keeping(name, packed)?;
        if let Some(p) = &self.progress {
            p.inc(1);
        }
        self.records.push(raw.record.clone());
        Ok(raw)
    }

    pub(crate) fn qtensor(&mut self, name: &str) -> Result<QTensor> {
        let raw = self.raw(name)?;
        Ok(ggml_file::qtensor_from_ggml(raw.ggml()?, &raw.bytes, raw.dims, &Device::Cpu)?)
    }

    /// A weight matrix on Veil's kernels where it has one (Q4_1, Q5_1,
    /// Q8_0, Q5_0, Q2_K–Q6_K, MXFP4, the i-quants, TQ1_0, TQ2_0), otherwise
    /// on candle's quantized matmul (or, for a type candle does not decode,
    /// dequantized).
    pub(crate) fn weight(&mut self, name: &str) -> Result<Weight> {
        let raw = self.matrix_raw(name)?;
        self.weight_from(name, raw)
    }

    pub(crate) fn weight_from(&mut self, name: &str, raw: RawTensor) -> Result<Weight> {
        let [rows, cols] = raw.dims[..] else {
            return Err(ModelError::Malformed(format!("{name} has shape {:?}, expected a matrix", raw.dims)));
        };
        let bad = |e: KernelError| ModelError::Malformed(format!("{name}: {e}"));
        if let Some(device) = &self.device {
            if raw.dtype == TensorType::Mxfp4 {
                // candle has no MXFP4: every MXFP4 value is exact in BF16
                // (two significant bits, an f32 exponent), at 2 bytes a weight.
                let values: Vec<f32> =
                    raw.bytes.chunks_exact(17).flat_map(super::quant::mxfp4::dequantize_block).collect();
                let t = QTensor::quantize(&Tensor::from_vec(values, (rows, cols), &Device::Cpu)?, GgmlDType::BF16)?;
                let t = ggml_file::qtensor_from_ggml(GgmlDType::BF16, &t.data()?, vec![rows, cols], device)?;
                return Ok(Weight::Candle { matmul: QMatMul::from_qtensor(t)?, rows, cols });
            }
            // Quantized in device memory; candle's quantized matmul kernels read it as is.
            let t = ggml_file::qtensor_from_ggml(raw.ggml()?, &raw.bytes, raw.dims, device)?;
            return Ok(Weight::Candle { matmul: QMatMul::from_qtensor(t)?, rows, cols });
        }
        // Kept packed; each block expands in registers to an exact 8-bit
        // block, so the kernels compute llama.cpp's MXFP4/IQ4_NL/Q5_0 × Q8_0 dot.
        if let Some(load) = expanded_loader(raw.dtype) {
            return Ok(Weight::Expanded(Arc::new(load(&raw.bytes, rows, cols).map_err(bad)?)));
        }
        let dtype = raw.ggml()?;
        if let Some(k) = KQuantMatrix::from_gguf_bytes(dtype, &raw.bytes, rows, cols) {
            return Ok(Weight::KQuant(Arc::new(k.map_err(bad)?)));
        }
        Ok(match dtype {
            GgmlDType::Q4_1 => Weight::Q41(Q41Matrix::from_gguf_bytes(&raw.bytes, rows, cols).map_err(bad)?),
            GgmlDType::Q8_0 => Weight::Q80(Arc::new(Q80Matrix::from_gguf_bytes(&raw.bytes, rows, cols).map_err(bad)?)),
            GgmlDType::Q5_1 => Weight::Q51(Arc::new(Q51Matrix::from_gguf_bytes(&raw.bytes, rows, cols).map_err(bad)?)),
            // Small f32 matrices (an MoE router): a plain row-wise dot, whose
            // result for a row does not depend on the rows beside it.
            GgmlDType::F32 => {
                let data: Vec<f32> =
                    raw.bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
                Weight::F32 { data: Arc::new(data), rows, cols }
            }
            dtype => {
                let t = ggml_file::qtensor_from_ggml(dtype, &raw.bytes, raw.dims, &Device::Cpu)?;
                Weight::Candle { matmul: QMatMul::from_qtensor(t)?, rows, cols }
            }
        })
    }

    /// The experts of a `[n_expert, rows, cols]` tensor (`ffn_*_exps`), one
    /// weight matrix each, from the one read (and hash) of the tensor.
    pub(crate) fn experts(&mut self, name: &str, n_expert: usize) -> Result<Vec<Weight>> {
        let raw = self.matrix_raw(name)?;
        let [n, rows, cols] = raw.dims[..] else {
            return Err(ModelError::Malformed(format!(
                "{name} has shape {:?}, expected [experts, rows, cols]",
                raw.dims
            )));
        };
        if n != n_expert || n == 0 || raw.bytes.len() % n != 0 {
            return Err(ModelError::Malformed(format!("{name} holds {n} experts, the model says {n_expert}")));
        }
        let per = raw.bytes.len() / n;
        let mut out = Vec::with_capacity(n);
        for (e, bytes) in raw.bytes.chunks_exact(per).enumerate() {
            let one = RawTensor {
                bytes: bytes.to_vec(),
                dtype: raw.dtype,
                dims: vec![rows, cols],
                record: raw.record.clone(),
            };
            out.push(self.weight_from(&format!("{name}[{e}]"), one)?);
        }
        Ok(out)
    }

    pub(crate) fn vector(&mut self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.qtensor(name)?.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1::<f32>()?;
        if v.len() != len {
            return Err(ModelError::Malformed(format!("{name} has {} values, expected {len}", v.len())));
        }
        Ok(v)
    }

    pub(crate) fn optional_vector(&mut self, name: &str, len: usize) -> Result<Option<Vec<f32>>> {
        if self.gguf.has_tensor(name) {
            self.vector(name, len).map(Some)
        } else {
            Ok(None)
        }
    }
}

/// The types outside candle's list that stay packed on the CPU (Veil's
/// kernels: [`expanded_loader`]); the others outside it are read
/// dequantized to F32 (Q1_0, Q8_K, F64).
const KEPT_PACKED: [GgmlType; 12] = [
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::NVFP4,
];

/// A decoder of raw `rows × cols` tensor bytes into an [`ExpandedMatrix`].
pub(crate) type ExpandedLoad = fn(&[u8], usize, usize) -> std::result::Result<ExpandedMatrix, KernelError>;

/// What decodes a tensor of `dtype` into an [`ExpandedMatrix`], for the
/// types whose blocks expand in registers to exact 8-bit blocks (so the
/// kernels compute llama.cpp's MXFP4/IQ4_NL/Q5_0 × Q8_0 dot).
pub(crate) fn expanded_loader(dtype: TensorType) -> Option<ExpandedLoad> {
    match dtype {
        TensorType::Mxfp4 => Some(ExpandedMatrix::from_mxfp4_bytes),
        TensorType::Other(GgmlType::IQ4_NL) => Some(ExpandedMatrix::from_iq4_nl_bytes),
        TensorType::Other(GgmlType::IQ4_XS) => Some(ExpandedMatrix::from_iq4_xs_bytes),
        TensorType::Ggml(GgmlDType::Q5_0) => Some(ExpandedMatrix::from_q5_0_bytes),
        TensorType::Other(GgmlType::IQ2_XXS) => Some(ExpandedMatrix::from_iq2_xxs_bytes),
        TensorType::Other(GgmlType::IQ2_XS) => Some(ExpandedMatrix::from_iq2_xs_bytes),
        TensorType::Other(GgmlType::IQ3_XXS) => Some(ExpandedMatrix::from_iq3_xxs_bytes),
        TensorType::Other(GgmlType::IQ3_S) => Some(ExpandedMatrix::from_iq3_s_bytes),
        TensorType::Other(GgmlType::IQ2_S) => Some(ExpandedMatrix::from_iq2_s_bytes),
        TensorType::Other(GgmlType::IQ1_S) => Some(ExpandedMatrix::from_iq1_s_bytes),
        TensorType::Other(GgmlType::IQ1_M) => Some(ExpandedMatrix::from_iq1_m_bytes),
        TensorType::Other(GgmlType::TQ1_0) => Some(ExpandedMatrix::from_tq1_0_bytes),
        TensorType::Other(GgmlType::TQ2_0) => Some(ExpandedMatrix::from_tq2_0_bytes),
        TensorType::Other(GgmlType::NVFP4) => Some(ExpandedMatrix::from_nvfp4_bytes),
        _ => None,
    }
}

/// A weight matrix: one of Veil's kernels, or candle's quantized matmul.
#[derive(Debug)]
pub(crate) enum Weight {
    Q41(Q41Matrix),
    Q80(Arc<Q80Matrix>),
    Expanded(Arc<ExpandedMatrix>),
    Q51(Arc<Q51Matrix>),
    KQuant(Arc<KQuantMatrix>),
    F32 { data: Arc<Vec<f32>>, rows: usize, cols: usize },
    Candle { matmul: QMatMul, rows: usize, cols: usize },
}

pub(crate) fn digest_f32s(h: &mut sha2::Sha256, values: &[f32]) {
    use sha2::Digest as _;
    h.update((values.len() as u64).to_le_bytes());
    for chunk in values.chunks(4096) {
        let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
        h.update(&bytes);
    }
}

impl Weight {
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        use sha2::Digest as _;
        match self {
            Self::Q41(m) => m.digest_into(h),
            Self::Q80(m) => m.digest_into(h),
            Self::Expanded(m) => m.digest_into(h),
            Self::Q51(m) => m.digest_into(h),
            Self::KQuant(m) => m.digest_into(h),
            Self::F32 { data, .. } => digest_f32s(h, data),
            Self::Candle { matmul: QMatMul::QTensor(t), .. } => h.update(&*t.data()?),
            Self::Candle { matmul: QMatMul::Tensor(t) | QMatMul::TensorF16(t), .. } => {
                digest_f32s(h, &t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?)
            }
        }
        Ok(())
    }

    pub(crate) fn rows(&self) -> usize {
        match self {
            Self::Q41(m) => m.rows(),
            Self::Q80(m) => m.rows(),
            Self::Expanded(m) => m.rows(),
            Self::Q51(m) => m.rows(),
            Self::KQuant(m) => m.rows(),
            Self::F32 { rows, .. } | Self::Candle { rows, .. } => *rows,
        }
    }

    pub(crate) fn cols(&self) -> usize {
        match self {
            Self::Q41(m) => m.cols(),
            Self::Q80(m) => m.cols(),
            Self::Expanded(m) => m.cols(),
            Self::Q51(m) => m.cols(),
            Self::KQuant(m) => m.cols(),
            Self::F32 { cols, .. } | Self::Candle { cols, .. } => *cols,
        }
    }

    /// `x (m × cols) → (m × rows)`.
    pub(crate) fn matmul(&self, x: &[f32], m: usize) -> Result<Vec<f32>> {
        Ok(match self {
            Self::Q41(w) => w.matmul(x, m),
            Self::Q80(w) => w.matmul(x, m),
            Self::Expanded(w) => w.matmul(x, m),
            Self::Q51(w) => w.matmul(x, m),
            Self::KQuant(w) => w.matmul(x, m),
            Self::F32 { data, rows, cols } => {
                let mut out = vec![0f32; m * rows];
                // Each output is one fixed-order dot, whatever the batch or
                // the threads (a dequantized matrix can be large).
                let per_task = (1 << 16) / (*cols).max(1) + 1;
                for (xr, or) in x.chunks_exact(*cols).zip(out.chunks_exact_mut(*rows)) {
                    if rows * cols < 1 << 20 {
                        for (o, w) in or.iter_mut().zip(data.chunks_exact(*cols)) {
                            *o = dot_f32(xr, w);
                        }
                        continue;
                    }
                    use rayon::prelude::*;
                    or.par_chunks_mut(per_task).zip(data.par_chunks(per_task * cols)).for_each(|(o, ws)| {
                        for (o, w) in o.iter_mut().zip(ws.chunks_exact(*cols)) {
                            *o = dot_f32(xr, w);
                        }
                    });
                }
                out
            }
            Self::Candle { matmul, cols, .. } => {
                let x = Tensor::from_slice(x, (m, *cols), &Device::Cpu)?;
                matmul.forward(&x)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?
            }
        })
    }
}

/// `a · b` in eight lanes, summed in a fixed order.
fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Projections of one input (q/k/v, or gate/up): a single stacked matmul
/// when every part is on the Q4_1 kernel, or all on one K-quant's, so the
/// input is quantized once and the threads are woken once.
#[derive(Debug)]
pub(crate) struct Projections {
    pub(crate) stacked: Option<Weight>,
    pub(crate) parts: Vec<Weight>,
    pub(crate) widths: Vec<usize>,
    pub(crate) biases: Vec<Option<Vec<f32>>>,
}

impl Projections {
    pub(crate) fn new(parts: Vec<Weight>, biases: Vec<Option<Vec<f32>>>, input: usize) -> Result<Self> {
        if parts.iter().any(|w| w.cols() != input) {
            return Err(ModelError::Malformed(format!("a projection does not take inputs of width {input}")));
        }
        let widths: Vec<usize> = parts.iter().map(Weight::rows).collect();
        for (b, w) in biases.iter().zip(&widths) {
            if b.as_ref().is_some_and(|b| b.len() != *w) {
                return Err(ModelError::Malformed("a bias does not match its projection".into()));
            }
        }
        // K-quant parts of one format stack the same way (gate and up of a
        // Q4_K_M file; its q/k/v mix formats and stay apart).
        let same_k = |w: &Weight, first: &Weight| match (w, first) {
            (Weight::KQuant(a), Weight::KQuant(b)) => a.format() == b.format() && Arc::strong_count(a) == 1,
            _ => false,
        };
        if parts.len() > 1 && parts.iter().all(|w| same_k(w, &parts[0])) {
            let owned: Vec<KQuantMatrix> = parts
                .into_iter()
                .filter_map(|w| if let Weight::KQuant(m) = w { Arc::into_inner(m) } else { None })
                .collect();
            let stacked = KQuantMatrix::stack(owned)
                .ok_or_else(|| ModelError::Malformed("stacked projections differ in format".into()))?
                .map_err(|e| ModelError::Malformed(e.to_string()))?;
            return Ok(Self { stacked: Some(Weight::KQuant(Arc::new(stacked))), parts: Vec::new(), widths, biases });
        }
        if parts.iter().all(|w| matches!(w, Weight::Q41(_))) {
            let q41 = parts.into_iter().filter_map(|w| if let Weight::Q41(m) = w { Some(m) } else { None });
            let stacked = Q41Matrix::stack(q41.collect()).map_err(|e| ModelError::Malformed(e.to_string()))?;
            return Ok(Self { stacked: Some(Weight::Q41(stacked)), parts: Vec::new(), widths, biases });
        }
        Ok(Self { stacked: None, parts, widths, biases })
    }

    /// One `(m × width_i)` output per part, biases added.
    pub(crate) fn forward(&self, x: &[f32], m: usize) -> Result<Vec<Vec<f32>>> {
        let mut outs = match &self.stacked {
            Some(w) => {
                let all = w.matmul(x, m)?;
                let total = w.rows();
                let mut outs: Vec<Vec<f32>> = self.widths.iter().map(|w| Vec::with_capacity(m * w)).collect();
                for row in all.chunks_exact(total) {
                    let mut at = 0;
                    for (out, w) in outs.iter_mut().zip(&self.widths) {
                        out.extend_from_slice(&row[at..at + w]);
                        at += w;
                    }
                }
                outs
            }
            None => self.parts.iter().map(|w| w.matmul(x, m)).collect::<Result<_>>()?,
        };
        for (out, bias) in outs.iter_mut().zip(&self.biases) {
            if let Some(b) = bias {
                for row in out.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
                }
            }
        }
        Ok(outs)
    }
}

impl Projections {
    pub(crate) fn digest_into(&self, h: &mut sha2::Sha256) -> Result<()> {
        if let Some(w) = &self.stacked {
            w.digest_into(h)?;
        }
        for w in &self.parts {
            w.digest_into(h)?;
        }
        for b in self.biases.iter().flatten() {
            digest_f32s(h, b);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A type Veil has kernels for is kept packed at load, and only such a
    /// type: one left off [`KEPT_PACKED`] would be read dequantized to F32
    /// and never reach its kernels.
    #[test]
    fn the_types_kept_packed_are_the_types_with_kernels() {
        for t in GgmlType::all() {
            let kernels = expanded_loader(TensorType::Other(t)).is_some();
            assert_eq!(KEPT_PACKED.contains(&t), kernels, "{t:?}");
        }
    }
}
