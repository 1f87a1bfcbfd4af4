//! Shard link frames: arbitrary bytes never panic the sans-IO decoder, and
//! every frame it accepts re-encodes to bytes that decode to the same frame.
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_enclave::link::frame::FrameDecoder;

fuzz_target!(|data: &[u8]| {
    let mut d = FrameDecoder::new(1 << 20);
    // Feed in two pieces to exercise partial frames.
    let cut = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    d.push(&data[..cut]);
    let mut frames = Vec::new();
    while let Ok(Some(f)) = d.next_frame() {
        frames.push(f);
    }
    d.push(&data[cut..]);
    while let Ok(Some(f)) = d.next_frame() {
        frames.push(f);
    }
    for f in frames {
        let mut again = FrameDecoder::new(usize::MAX);
        again.push(&f.encode());
        assert_eq!(again.next_frame().expect("re-encoded frame decodes"), Some(f));
    }
});
