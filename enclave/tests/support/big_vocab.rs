//! A small random-weight Llama GGUF with a large vocabulary (Qwen2/3's
//! 151,936 tokens by default): what a model of a real vocabulary size looks
//! like to the pipeline, without downloading one. Sentencepiece tokenizer:
//! control tokens, the 256 byte tokens, then filler pieces.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use candle_core::quantized::gguf_file::{write, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

/// Writes the model to `path`: `layers` layers of width `d`, `vocab` tokens.
pub fn write_big_vocab_model(path: &Path, vocab: usize, layers: u32, d: usize) {
    let ff = 2 * d;
    let mut seed = 0x5eed_u64;
    let mut rand = |n: usize, scale: f32| veil_enclave::model::synth::uniform(n, scale, &mut seed);
    let q = |data: Vec<f32>, shape: (usize, usize)| {
        QTensor::quantize(&Tensor::from_vec(data, shape, &Device::Cpu).unwrap(), GgmlDType::Q8_0).unwrap()
    };
    let ones = |n: usize| {
        QTensor::quantize(&Tensor::from_vec(vec![1f32; n], n, &Device::Cpu).unwrap(), GgmlDType::F32).unwrap()
    };
    let mut tensors: Vec<(String, QTensor)> = vec![("token_embd.weight".into(), q(rand(vocab * d, 2.0), (vocab, d)))];
    for l in 0..layers {
        let p = format!("blk.{l}");
        for (name, rows, cols) in [
            ("attn_q", d, d),
            ("attn_k", d, d),
            ("attn_v", d, d),
            ("attn_output", d, d),
            ("ffn_gate", ff, d),
            ("ffn_up", ff, d),
            ("ffn_down", d, ff),
        ] {
            tensors.push((format!("{p}.{name}.weight"), q(rand(rows * cols, 0.3), (rows, cols))));
        }
        tensors.push((format!("{p}.attn_norm.weight"), ones(d)));
        tensors.push((format!("{p}.ffn_norm.weight"), ones(d)));
    }
    tensors.push(("output_norm.weight".into(), ones(d)));
    tensors.push(("output.weight".into(), q(rand(vocab * d, 1.0), (vocab, d))));
    let mut tokens: Vec<Value> = ["<unk>", "<s>", "</s>"].iter().map(|t| Value::String((*t).into())).collect();
    let mut types = vec![Value::I32(2), Value::I32(3), Value::I32(3)];
    for b in 0..=255u8 {
        tokens.push(Value::String(format!("<0x{b:02X}>")));
        types.push(Value::I32(6));
    }
    while tokens.len() < vocab {
        tokens.push(Value::String(format!("▁w{}", tokens.len())));
        types.push(Value::I32(1));
    }
    let scores: Vec<Value> = (0..vocab).map(|i| Value::F32(-(i as f32))).collect();
    let heads = (d / 16) as u32;
    let meta = vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("random big-vocabulary test model".into())),
        ("llama.block_count", Value::U32(layers)),
        ("llama.embedding_length", Value::U32(d as u32)),
        ("llama.feed_forward_length", Value::U32(ff as u32)),
        ("llama.attention.head_count", Value::U32(heads)),
        ("llama.attention.head_count_kv", Value::U32(heads)),
        ("llama.context_length", Value::U32(512)),
        ("llama.vocab_size", Value::U32(vocab as u32)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("tokenizer.ggml.model", Value::String("llama".into())),
        ("tokenizer.ggml.tokens", Value::Array(tokens)),
        ("tokenizer.ggml.scores", Value::Array(scores)),
        ("tokenizer.ggml.token_type", Value::Array(types)),
        ("tokenizer.ggml.unknown_token_id", Value::U32(0)),
        ("tokenizer.ggml.bos_token_id", Value::U32(1)),
        ("tokenizer.ggml.eos_token_id", Value::U32(2)),
    ];
    let meta_refs: Vec<(&str, &Value)> = meta.iter().map(|(k, v)| (*k, v)).collect();
    let refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    write(&mut std::fs::File::create(path).unwrap(), &meta_refs, &refs).unwrap();
}
