//! Arbitrary bytes as a GGUF file from the host's disk: the header parser,
//! the configuration, and loading every tensor and every layer slice never
//! panic; whatever is refused is refused with a typed error.
#![no_main]

use std::io::Cursor;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use veil_enclave::model::{Config, GgufFile, LayerSlice};

fuzz_target!(|data: &[u8]| {
    let len = data.len() as u64;
    let open = || GgufFile::from_source(Path::new("fuzz.gguf"), Box::new(Cursor::new(data.to_vec())), len);
    let Ok(mut g) = open() else { return };
    for name in g.tensor_names() {
        let _ = g.tensor_bytes(&name);
        let _ = g.load_raw(&name);
    }
    let Ok(mut g) = open() else { return };
    if let Ok(c) = Config::from_gguf(&g) {
        // Bounded: a fuzzed header may claim any layer count.
        let _ = LayerSlice::from_gguf(&mut g, 0..c.n_layer.clamp(1, 4));
    }
});
