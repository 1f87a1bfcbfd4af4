//! Where a slice computes: Veil's fused CPU kernels, or candle's tensor ops
//! on a device (an NVIDIA GPU with the `cuda` feature).
//!
//! The slice, its KV cache, the link, speculation and the gateway are the
//! same code on both; only [`LayerSlice::forward_batch`](super::LayerSlice::forward_batch)
//! dispatches. On a device the weights stay quantized in device memory
//! (candle's GGUF quantized matmuls), the KV cache lives there too, and
//! activations cross to host memory only at the slice's boundary (the link).

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use super::error::{ModelError, Result};

/// The device a shard computes its layers on (`--device`, or a stage's
/// `device` in the route file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ComputeDevice {
    /// Veil's fused CPU kernels (AVX2, AVX-512 VNNI where present).
    #[default]
    Cpu,
    /// candle's tensor ops on the CPU: the device path's arithmetic,
    /// runnable where no GPU is (to check it, not to serve: it is slower).
    CandleCpu,
    /// CUDA device `N` (build with `--features cuda`).
    Cuda(usize),
}

impl ComputeDevice {
    /// Whether the forward runs on candle's ops rather than the fused kernels.
    pub fn is_candle(self) -> bool {
        !matches!(self, Self::Cpu)
    }

    /// Whether this is a GPU.
    pub fn is_gpu(self) -> bool {
        matches!(self, Self::Cuda(_))
    }

    /// Opens the device. A CUDA device on a build without the `cuda`
    /// feature, or where the driver or the GPU is missing, is one clear
    /// error naming what is missing.
    pub fn open(self) -> Result<Device> {
        match self {
            Self::Cpu | Self::CandleCpu => Ok(Device::Cpu),
            Self::Cuda(n) => open_cuda(n),
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(n: usize) -> Result<Device> {
    Device::new_cuda(n).map_err(|e| {
        // candle appends a backtrace to some errors; the first line is the cause.
        let e = e.to_string();
        let cause = e.lines().next().unwrap_or_default();
        ModelError::Device(format!(
            "cannot open CUDA device {n}: {cause} (is the NVIDIA driver installed and GPU {n} visible to this VM?)"
        ))
    })
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(n: usize) -> Result<Device> {
    Err(ModelError::Device(format!(
        "cuda:{n} asked for, but this veil-shard was built without CUDA support: \
         rebuild with `--features cuda` (see scripts/cuda-toolchain.sh)"
    )))
}

impl fmt::Display for ComputeDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::CandleCpu => f.write_str("candle-cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// A `--device` value that names no compute device (the caller is to blame).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown device {input:?}: expected cpu, cuda or cuda:N")]
#[non_exhaustive]
pub struct ParseDeviceError {
    /// The text given.
    pub input: String,
}

impl FromStr for ComputeDevice {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> std::result::Result<Self, ParseDeviceError> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "candle-cpu" => Ok(Self::CandleCpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) if n < 64 => Ok(Self::Cuda(n)),
                _ => Err(ParseDeviceError { input: s.to_owned() }),
            },
        }
    }
}

impl serde::Serialize for ComputeDevice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for ComputeDevice {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for (text, dev) in
            [("cpu", ComputeDevice::Cpu), ("candle-cpu", ComputeDevice::CandleCpu), ("cuda:3", ComputeDevice::Cuda(3))]
        {
            assert_eq!(text.parse::<ComputeDevice>().unwrap(), dev);
            assert_eq!(dev.to_string(), text);
        }
        assert_eq!("cuda".parse::<ComputeDevice>().unwrap(), ComputeDevice::Cuda(0));
        for bad in ["gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99", "CPU", ""] {
            assert!(bad.parse::<ComputeDevice>().is_err(), "{bad}");
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_is_a_clear_error() {
        let err = ComputeDevice::Cuda(0).open().unwrap_err().to_string();
        assert!(err.contains("built without CUDA support") && err.contains("--features cuda"), "{err}");
    }
}
