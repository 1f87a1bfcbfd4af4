//! The quantized matrix products alone: one prefill-sized product (128
//! input rows) and one decode product per type, at Llama-3.2-1B's
//! feed-forward shapes, on the kernels this CPU picks by default and on
//! the AVX2 kernels (`VEIL_KERNELS=avx2`, a child process), side by side.
//! For finding where a model's time goes; the model bench
//! (`--bench model`) is the comparison with llama.cpp.
//!
//! `cargo bench -p veil-enclave --bench kernels [-- TYPE...]`, one thread
//! unless `RAYON_NUM_THREADS` says otherwise.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::process::Command;
use std::time::Instant;

use candle_core::quantized::GgmlDType;
use half::f16;
use veil_enclave::model::kernels::{expanded::ExpandedMatrix, kquant::KQuantMatrix, Q80Matrix};

/// A product the bench times.
enum Matrix {
    Q80(Q80Matrix),
    K(KQuantMatrix),
    E(ExpandedMatrix),
}

impl Matrix {
    fn matmul(&self, x: &[f32], m: usize) -> Vec<f32> {
        match self {
            Self::Q80(w) => w.matmul(x, m),
            Self::K(w) => w.matmul(x, m),
            Self::E(w) => w.matmul(x, m),
        }
    }
}

/// Deterministic bytes (xorshift), so every run times the same blocks.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// `rows × cols` of type `name`: random blocks whose f16 scales are set to
/// small finite values (block size, and the scales' byte offsets).
fn matrix(name: &str, rows: usize, cols: usize) -> Matrix {
    let (block, values, scales): (usize, usize, &[usize]) = match name {
        "Q8_0" => (34, 32, &[0]),
        "Q2_K" => (84, 256, &[80, 82]),
        "Q3_K" => (110, 256, &[108]),
        "Q4_K" => (144, 256, &[0, 2]),
        "Q5_K" => (176, 256, &[0, 2]),
        "Q6_K" => (210, 256, &[208]),
        "IQ4_XS" => (136, 256, &[0]),
        "IQ4_NL" => (18, 32, &[0]),
        other => panic!("no bench for {other}"),
    };
    let mut raw = bytes(rows * cols / values * block, 7);
    for b in raw.chunks_exact_mut(block) {
        for &o in scales {
            b[o..o + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        }
    }
    let k = |t| Matrix::K(KQuantMatrix::from_gguf_bytes(t, &raw, rows, cols).unwrap().unwrap());
    match name {
        "Q8_0" => Matrix::Q80(Q80Matrix::from_gguf_bytes(&raw, rows, cols).unwrap()),
        "Q2_K" => k(GgmlDType::Q2K),
        "Q3_K" => k(GgmlDType::Q3K),
        "Q4_K" => k(GgmlDType::Q4K),
        "Q5_K" => k(GgmlDType::Q5K),
        "Q6_K" => k(GgmlDType::Q6K),
        "IQ4_XS" => Matrix::E(ExpandedMatrix::from_iq4_xs_bytes(&raw, rows, cols).unwrap()),
        "IQ4_NL" => Matrix::E(ExpandedMatrix::from_iq4_nl_bytes(&raw, rows, cols).unwrap()),
        _ => unreachable!(),
    }
}

/// Child: `{type: [prefill GMAC/s, decode GMAC/s]}` as JSON.
fn child(types: &[String]) {
    let shapes = [(8192, 2048), (2048, 8192)];
    let mut out = serde_json::Map::new();
    for name in types {
        let mut best = [f64::INFINITY; 2];
        let mut macs = [0f64; 2];
        for &(rows, cols) in &shapes {
            let w = matrix(name, rows, cols);
            for (k, m) in [std::env::var("VEIL_BENCH_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(128usize), 1]
                .into_iter()
                .enumerate()
            {
                let x: Vec<f32> = bytes(m * cols, 3).iter().map(|&b| f32::from(b) / 64.0 - 2.0).collect();
                let mut t_best = f64::INFINITY;
                for _ in 0..if m == 1 { 40 } else { 8 } {
                    let t = Instant::now();
                    std::hint::black_box(w.matmul(&x, m));
                    t_best = t_best.min(t.elapsed().as_secs_f64());
                }
                best[k] = if best[k].is_finite() { best[k] + t_best } else { t_best };
                macs[k] += (rows * cols * m) as f64;
            }
        }
        out.insert(name.clone(), serde_json::json!([macs[0] / best[0] / 1e9, macs[1] / best[1] / 1e9]));
    }
    println!("{}", serde_json::Value::Object(out));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    if args.first().map(String::as_str) == Some("child") {
        return child(&args[1..]);
    }
    if std::env::args().any(|a| a == "--test") {
        return;
    }
    let types: Vec<String> = if args.is_empty() {
        ["Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ4_NL"].map(String::from).to_vec()
    } else {
        args
    };
    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "1".into());
    let run = |kernels: Option<&str>| -> serde_json::Value {
        let mut c = Command::new(std::env::current_exe().unwrap());
        c.arg("child").args(&types).env("RAYON_NUM_THREADS", &threads);
        if let Some(k) = kernels {
            c.env("VEIL_KERNELS", k);
        }
        let out = c.output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    };
    let (default, avx2) = (run(None), run(Some("avx2")));
    println!("\nquantized products, {threads} thread(s), GMAC/s; 8192×2048 and 2048×8192, 128 input rows and 1");
    println!(
        "{:<8} {:>16} {:>16} {:>16} {:>16}",
        "type", "prefill default", "prefill avx2", "decode default", "decode avx2"
    );
    for t in &types {
        let f = |v: &serde_json::Value, k: usize| v[t][k].as_f64().map_or("-".into(), |x| format!("{x:.1}"));
        println!("{:<8} {:>16} {:>16} {:>16} {:>16}", t, f(&default, 0), f(&avx2, 0), f(&default, 1), f(&avx2, 1));
    }
}
