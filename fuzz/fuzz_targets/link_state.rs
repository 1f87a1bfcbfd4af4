//! The link state machine on arbitrary frame sequences, from either side and
//! with or without pinned requirements: never panics, and after a violation
//! the caller drops the link (nothing further is judged).
#![no_main]

use libfuzzer_sys::fuzz_target;
use veil_enclave::link::frame::{FrameDecoder, LinkRole};
use veil_enclave::link::state::{LinkState, PeerRequirement, Side};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let side = if mode & 1 == 0 { Side::Dialer } else { Side::Acceptor };
    let require = if mode & 2 == 0 {
        PeerRequirement { role: None, layers: None, manifest_root: None }
    } else {
        PeerRequirement {
            role: Some(LinkRole::Data),
            layers: veil_attestation::LayerRange::new(0, 10).ok(),
            manifest_root: Some(veil_attestation::ManifestRoot([1; 32])),
        }
    };
    let mut state = LinkState::new(side, require);
    let mut d = FrameDecoder::new(1 << 20);
    d.push(rest);
    while let Ok(Some(frame)) = d.next_frame() {
        if state.on_receive(&frame).is_err() {
            break;
        }
    }
});
