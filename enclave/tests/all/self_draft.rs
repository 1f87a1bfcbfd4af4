//! Drafts derived from the target's own blocks (issue 28, self-speculation):
//! a layer-skipping draft holds exactly the kept blocks, renumbered, each
//! with its attention kind; the selection's acceptance measure is exact (the
//! target agrees with its own greedy continuations everywhere) and it picks
//! the candidate it scores best within the cost budget.

use std::time::Duration;

use candle_core::quantized::gguf_file;
use candle_core::Device;

use crate::cluster::model_path;
use crate::families::TempDir;
use veil_enclave::generate::LocalModel;
use veil_enclave::model::config::Config;
use veil_enclave::model::synth::{write_with, Options, Shape};
use veil_enclave::model::{GgufFile, LayerSlice, Logits, SliceOutput};
use veil_enclave::speculate::derive::{derive_draft, format_layers, parse_layers};
use veil_enclave::speculate::select::{agreement, calibration, select};

fn tensor_bytes(path: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    let mut names: Vec<String> = content.tensor_infos.keys().cloned().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| (n.clone(), content.tensor(&mut f, &n, &Device::Cpu).unwrap().data().unwrap().to_vec()))
        .collect()
}

#[test]
fn a_layer_skipping_draft_keeps_the_chosen_blocks_and_their_attention_kind() {
    let tmp = TempDir::new("self-draft");
    let target = tmp.path().join("gemma3.gguf");
    write_with(&target, Shape::GEMMA3_SMOKE, &Options::new(veil_enclave::model::synth::dtype_named("q8_0").unwrap()))
        .unwrap();
    let tc = Config::from_gguf(&GgufFile::open(&target).unwrap()).unwrap();
    // Gemma 3 interleaves five local layers with one global: keep both kinds,
    // so renumbering by the family's period would get block 2 wrong.
    let keep = parse_layers("0,2,5").unwrap();
    assert!(tc.is_swa(0) && tc.is_swa(2) && !tc.is_swa(5));
    let draft = tmp.path().join("draft.gguf");
    let d = derive_draft(&target, &draft, &keep, None).unwrap();
    assert_eq!((d.layers.clone(), d.target_layers), (keep.clone(), 6));
    let dc = Config::from_gguf(&GgufFile::open(&draft).unwrap()).unwrap();
    assert_eq!(dc.n_layer, 3);
    for (i, &l) in keep.iter().enumerate() {
        assert_eq!(dc.is_swa(i), tc.is_swa(l), "draft block {i} is the target's {l}");
    }
    // Every tensor of the draft is the target's, byte for byte, under its new
    // number; nothing of the dropped blocks is carried.
    let theirs: std::collections::BTreeMap<String, Vec<u8>> = tensor_bytes(&target).into_iter().collect();
    let ours = tensor_bytes(&draft);
    let block_tensors = theirs.keys().filter(|n| n.starts_with("blk.0.")).count();
    let other_tensors = theirs.keys().filter(|n| !n.starts_with("blk.")).count();
    assert_eq!(ours.len(), other_tensors + 3 * block_tensors);
    for (name, bytes) in &ours {
        let source = match name.strip_prefix("blk.") {
            None => name.clone(),
            Some(rest) => {
                let (i, tail) = rest.split_once('.').unwrap();
                format!("blk.{}.{tail}", keep[i.parse::<usize>().unwrap()])
            }
        };
        assert_eq!(Some(bytes), theirs.get(&source), "{name} is not the target's {source}");
    }
    // Keeping every block gives the target's logits exactly.
    let whole = tmp.path().join("whole.gguf");
    derive_draft(&target, &whole, &(0..6).collect::<Vec<_>>(), None).unwrap();
    let ids = [1u32, 7, 42, 99, 3, 250, 17];
    let run = |p: &std::path::Path| {
        let slice = LayerSlice::load(p, 0..6).unwrap();
        let mut kv = slice.new_session(16 << 20);
        match slice.forward(slice.embed(&ids).unwrap(), &mut kv, 0, Logits::All).unwrap() {
            SliceOutput::Logits(rows) => rows.into_vec(),
            other => panic!("expected logits, got {other:?}"),
        }
    };
    assert_eq!(run(&whole), run(&target));
    // Bad lists are refused by name.
    for bad in [vec![2, 1], vec![6], vec![], vec![1, 1]] {
        let e = derive_draft(&target, &tmp.path().join("bad.gguf"), &bad, None).unwrap_err().to_string();
        assert!(e.contains("distinct ascending blocks"), "{bad:?}: {e}");
    }
    assert!(parse_layers("3-1").is_err() && parse_layers("0,0").is_err() && parse_layers("x").is_err());
    assert_eq!(format_layers(&parse_layers("0-4,6-8,10,29").unwrap()), "0-4,6-8,10,29");
}

#[test]
fn self_speculation_measures_acceptance_exactly_and_picks_the_best_scored_draft() {
    let Some(path) = model_path() else { return };
    let (model, tok) = LocalModel::load(&path, &[]).unwrap();
    let seqs = calibration(&model, &tok).unwrap();
    // The target's own argmax is its greedy continuation at every position
    // measured: an off-by-one in the positions would break this.
    let own = agreement(&model, &seqs).unwrap();
    assert!(own.iter().flatten().all(|&a| a));
    assert!(own.iter().map(Vec::len).sum::<usize>() >= 4 * 16);
    drop(model);

    let tmp = TempDir::new("self-select");
    let round = Duration::from_millis(200);
    let sel = select(&path, tmp.path(), round, 1.0).unwrap();
    println!("{}", sel.table());
    assert_eq!(sel.measured.len(), 7);
    for m in &sel.measured {
        assert!((0.0..1.0).contains(&m.agreement), "{}: a proper subset cannot always agree", m.candidate.kind);
        assert!(m.kept.windows(2).all(|w| w[0] <= w[1] + 1e-12));
    }
    let (best, k) = sel.best.expect("at 200 ms per round some derived draft pays");
    let score = |i: usize| sel.measured[i].best_k(round).1;
    assert_eq!(k, sel.measured[best].best_k(round).0);
    let within = |i: usize| sel.measured[i].cost(sel.target_step) <= 1.0;
    assert!(within(best));
    assert!((0..sel.measured.len()).filter(|&i| within(i)).all(|i| score(i) <= score(best)));
    // A budget the candidates cannot meet picks none (the choice `select`
    // makes, on the same measurements); scratch files are gone.
    assert!(sel.best_within(0.0).is_none());
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
}
