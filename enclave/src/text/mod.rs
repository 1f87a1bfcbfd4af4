//! The entry shard's text side: tokenizer, chat template, sampler.

pub mod calls;
pub mod grammar;
pub mod harmony;
pub mod reasoning;
pub mod sampler;
pub mod spm;
pub mod template;
pub mod tokenizer;
pub mod tools;
pub mod xml_calls;
