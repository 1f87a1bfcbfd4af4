//! `veil-shard perplexity`: a model's perplexity over a text, by llama.cpp's
//! method (`llama-perplexity`), so the two can be compared on the same file:
//!
//! - the whole text is tokenized once, BOS first where the model adds one;
//! - it is cut into non-overlapping windows of `--ctx` tokens (at most
//!   `--chunks` of them), each run from an empty cache with its first token
//!   replaced by BOS where the model adds one;
//! - in each window, the positions of its second half predict the token after
//!   them: `first = ctx / 2`, positions `first .. ctx - 1`, `ctx - first - 1`
//!   scores per window;
//! - perplexity is `exp` of the mean negative log-likelihood.
//!
//! `--save-logits FILE` keeps every scored position's log-probabilities (f16)
//! and the tokens; `--kl-base FILE` reads such a file (of a base model on the
//! same text) and adds the mean KL divergence of this model's distributions
//! from the base's and how often their top tokens agree, as llama.cpp's
//! `--kl-divergence` does for a quantized file against its base.
//!
//! `--save-scores FILE` writes each scored position's log-probability of the
//! token that follows it, one per line, locally or through `--entry`.
//!
//! `--entry URL --policy FILE` scores the same windows on a running route
//! instead, end to end: it verifies every shard against the policy, as any
//! client does, and sends each window (token ids, tokenized here with
//! `--model`'s vocabulary) as a sealed `/v1/completions` request with
//! `echo`, `logprobs: 0` and `max_tokens: 0`; the entry returns each
//! token's log-probability, computed over every stage. Only the scored
//! tokens' log-probabilities come back, so `--save-logits` and `--kl-base`
//! are local only.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::generate::LocalModel;

#[derive(Debug, clap::Args)]
pub(super) struct PerplexityArgs {
    /// The GGUF.
    #[arg(long)]
    model: PathBuf,
    /// The text (UTF-8).
    #[arg(long)]
    file: PathBuf,
    /// Tokens per window.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Most windows (all that fit by default).
    #[arg(long)]
    chunks: Option<usize>,
    /// Save the scored positions' log-probabilities here.
    #[arg(long, conflicts_with = "kl_base")]
    save_logits: Option<PathBuf>,
    /// Compare with a base model's saved log-probabilities.
    #[arg(long)]
    kl_base: Option<PathBuf>,
    /// Write each scored position's log-probability of the token that
    /// follows it here, one per line in order (locally or through
    /// `--entry`): what per-token comparisons with another engine need.
    #[arg(long, value_name = "FILE")]
    save_scores: Option<PathBuf>,
    /// Split the model into stages at these layers (checks that a split
    /// model scores as one: the same figures).
    #[arg(long, value_delimiter = ',')]
    split: Vec<usize>,
    /// Score on a running route through its entry (`http://HOST:PORT`, the
    /// host's public URL) instead of in this process; `--model` then gives
    /// only the vocabulary (the route's model file).
    #[arg(long, requires = "policy", conflicts_with_all = ["save_logits", "kl_base", "split"])]
    entry: Option<String>,
    /// With `--entry`: the policy every shard must satisfy (TOML, or a signed
    /// bundle with `--policy-key`).
    #[arg(long, value_name = "FILE", requires = "entry")]
    policy: Option<PathBuf>,
    /// With `--entry`: the publisher's public key (PEM) of a signed policy bundle.
    #[arg(long, value_name = "PEM", requires = "policy")]
    policy_key: Option<PathBuf>,
    /// With `--entry`: where a signed policy bundle must be logged.
    #[command(flatten)]
    log: veil_client::cli::LogTrustArgs,
    /// With `--entry`: also trust these PEM certificate authorities for an https:// URL.
    #[arg(long, requires = "entry")]
    ca: Option<PathBuf>,
}

/// Where the windows are scored.
enum Scorer {
    /// In this process: whole log-probability rows.
    Local(LocalModel),
    /// On a verified route, through its entry: the scored tokens' only.
    Entry { client: Box<veil_client::sdk::Client>, rt: Box<tokio::runtime::Runtime> },
}

impl Scorer {
    fn connect(url: &str, args: &PerplexityArgs) -> anyhow::Result<Self> {
        let Some(path) = &args.policy else { bail!("--entry needs --policy") };
        let policy = veil_client::cli::policy_bundle::load_policy(path, args.policy_key.as_deref(), &args.log)?;
        let mut options = veil_client::sdk::ConnectOptions::default();
        if let Some(ca) = &args.ca {
            options = options.with_ca_file(ca)?;
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let client = rt.block_on(veil_client::sdk::Client::connect_with(url, &policy, &options)).map_err(|e| {
            if let Some(t) = e.check_table() {
                eprintln!("{t}");
            }
            anyhow::anyhow!("{url}: {e}")
        })?;
        let route = client.route();
        if let Some(notice) = route.simulated_notice() {
            eprintln!("{notice}");
        }
        eprintln!("route verified: model {}, the entry and {} more shard(s)", route.model(), route.shards().len());
        Ok(Self::Entry { client: Box::new(client), rt: Box::new(rt) })
    }
}

/// Each token's log-probability after those before it (the first token's is
/// `None`), as the entry at the other end of `client` computed them.
async fn score_on_route(client: &veil_client::sdk::Client, window: &[u32]) -> anyhow::Result<Vec<Option<f32>>> {
    let params = serde_json::json!({ "echo": true, "logprobs": 0, "max_tokens": 0, "temperature": 0 });
    let resp = client.complete(serde_json::json!(window), params).await?;
    let status = resp.status;
    let body = resp.collect().await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if status != 200 {
        bail!("the entry answered {status}: {}", v["error"]["message"].as_str().unwrap_or("no message"));
    }
    let Some(lps) = v["choices"][0]["logprobs"]["token_logprobs"].as_array() else {
        bail!("the entry's answer has no token_logprobs");
    };
    if lps.len() != window.len() {
        bail!("the entry scored {} tokens of a window of {}", lps.len(), window.len());
    }
    Ok(lps.iter().map(|l| l.as_f64().map(|l| l as f32)).collect())
}

/// The saved log-probabilities' file: this magic, then u32 LE ctx, vocab,
/// positions; the tokens of the scored windows (u32 LE, `chunks * ctx`);
/// then per scored position `vocab` log-probabilities as f16 LE.
const MAGIC: &[u8; 8] = b"VEILLGP1";

pub(super) fn perplexity(args: PerplexityArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    let (scorer, tok) = match &args.entry {
        None => {
            let (model, tok) = LocalModel::load(&args.model, &args.split)
                .with_context(|| format!("loading {}", args.model.display()))?;
            (Scorer::Local(model), tok)
        }
        Some(url) => {
            let gguf = crate::model::GgufFile::open(&args.model)
                .with_context(|| format!("opening {}", args.model.display()))?;
            let tok = crate::text::tokenizer::Tokenizer::from_gguf(&gguf)
                .with_context(|| format!("reading the vocabulary of {}", args.model.display()))?;
            (Scorer::connect(url, &args)?, tok)
        }
    };
    let ctx = args.ctx;
    if let Scorer::Local(model) = &scorer {
        if ctx < 8 || ctx > model.context_length() {
            bail!("--ctx must be from 8 to the model's context ({})", model.context_length());
        }
    } else if ctx < 8 {
        bail!("--ctx must be at least 8");
    }
    let bos = tok.bos_added();
    let tokens = tok.tokenize(&text, true, false)?;
    let fit = tokens.len() / ctx;
    let chunks = args.chunks.map_or(fit, |c| c.min(fit));
    if chunks == 0 {
        bail!("the text has {} tokens, fewer than one window of {ctx}", tokens.len());
    }
    let first = ctx / 2;
    let scored = ctx - first - 1;
    let vocab = tok.vocab_size();
    eprintln!(
        "{} tokens, {chunks} windows of {ctx}, {scored} scored each{}",
        tokens.len(),
        if bos.is_some() { ", BOS first" } else { "" }
    );
    let windows = &tokens[..chunks * ctx];
    let mut save =
        args.save_logits.as_deref().map(|p| logits_file(p, (ctx, vocab, chunks * scored), windows)).transpose()?;
    let mut base = args.kl_base.as_deref().map(|p| kl_base(p, (ctx, vocab, chunks * scored), windows)).transpose()?;
    let bar = indicatif::ProgressBar::new(chunks as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} windows, {elapsed} (eta {eta}) {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let (mut nll, mut count) = (0f64, 0usize);
    let mut scores: Vec<f32> = Vec::with_capacity(if args.save_scores.is_some() { chunks * scored } else { 0 });
    let (mut kl_sum, mut agree) = (0f64, 0usize);
    let mut base_row = vec![0u8; 2 * vocab];
    for c in 0..chunks {
        let mut window = tokens[c * ctx..(c + 1) * ctx].to_vec();
        if let Some(b) = bos {
            window[0] = b;
        }
        let model = match &scorer {
            Scorer::Local(model) => model,
            Scorer::Entry { client, rt } => {
                let lps = rt.block_on(score_on_route(client, &window)).with_context(|| format!("window {c}"))?;
                for j in first..ctx - 1 {
                    let Some(lp) = lps[j + 1] else { bail!("window {c}: the entry did not score token {}", j + 1) };
                    nll -= f64::from(lp);
                    count += 1;
                    if args.save_scores.is_some() {
                        scores.push(lp);
                    }
                }
                bar.inc(1);
                bar.set_message(format!("ppl {:.4}", (nll / count as f64).exp()));
                continue;
            }
        };
        let mut session = model.session(1 << 40);
        let logits = model.step(&mut session, &window)?;
        for j in first..ctx - 1 {
            let lp = log_softmax(logits.row(j));
            nll -= f64::from(lp[window[j + 1] as usize]);
            count += 1;
            if args.save_scores.is_some() {
                scores.push(lp[window[j + 1] as usize]);
            }
            if let Some(w) = save.as_mut() {
                let bytes: Vec<u8> = lp.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect();
                w.write_all(&bytes)?;
            }
            if let Some(r) = base.as_mut() {
                r.read_exact(&mut base_row)?;
                let theirs: Vec<f32> =
                    base_row.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                kl_sum += kl(&theirs, &lp);
                agree += usize::from(argmax(&theirs) == argmax(&lp));
            }
        }
        bar.inc(1);
        bar.set_message(format!("ppl {:.4}", (nll / count as f64).exp()));
    }
    bar.finish_and_clear();
    if let Some(mut w) = save {
        w.flush()?;
    }
    if let Some(path) = &args.save_scores {
        let lines: String = scores.iter().map(|lp| format!("{lp:.6}\n")).collect();
        std::fs::write(path, lines).with_context(|| format!("writing {}", path.display()))?;
    }
    let ppl = (nll / count as f64).exp();
    if base.is_some() {
        println!("kl_divergence: {:.6}", kl_sum / count as f64);
        println!("top1_agreement: {:.4} ({agree}/{count})", agree as f64 / count as f64);
    }
    let (routed, ties) = crate::model::routing_counts();
    if routed > 0 {
        // A mixture of experts ran here: how often its routing was a coin toss.
        println!("router_rows: {routed}");
        println!("router_near_ties: {ties} (last chosen within {} of the next)", crate::model::NEAR_TIE);
    }
    println!("scored: {count}");
    println!("perplexity: {ppl:.4}");
    Ok(())
}

/// A `--save-logits` file with its header written: the magic, `ctx`,
/// `vocab`, the scored positions, then the windows' tokens.
fn logits_file(
    path: &Path,
    (ctx, vocab, positions): (usize, usize, usize),
    windows: &[u32],
) -> anyhow::Result<BufWriter<File>> {
    let mut w = BufWriter::new(File::create(path).with_context(|| format!("creating {}", path.display()))?);
    w.write_all(MAGIC)?;
    for v in [ctx, vocab, positions] {
        w.write_all(&(v as u32).to_le_bytes())?;
    }
    for &t in windows {
        w.write_all(&t.to_le_bytes())?;
    }
    Ok(w)
}

/// A `--kl-base` file read up to its first row, checked against this run:
/// the same `ctx` and vocabulary, at least as many scored positions, and
/// the same tokens in the windows (another text or tokenizer is refused).
fn kl_base(
    path: &Path,
    (ctx, vocab, positions): (usize, usize, usize),
    windows: &[u32],
) -> anyhow::Result<BufReader<File>> {
    let mut r = BufReader::new(File::open(path).with_context(|| format!("opening {}", path.display()))?);
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    let mut u32s = |n: usize| -> anyhow::Result<Vec<u32>> {
        let mut b = vec![0u8; 4 * n];
        r.read_exact(&mut b)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    };
    if &magic != MAGIC {
        bail!("{} is not a --save-logits file", path.display());
    }
    let head = u32s(3)?;
    if head[0] as usize != ctx || head[1] as usize != vocab || (head[2] as usize) < positions {
        bail!(
            "{} was saved with ctx {}, vocab {}, {} positions: not this run's",
            path.display(),
            head[0],
            head[1],
            head[2]
        );
    }
    let scored = ctx - ctx / 2 - 1;
    let theirs = u32s(head[2] as usize / scored * ctx)?;
    if theirs[..windows.len()] != *windows {
        bail!("{} was saved over other tokens (another text or tokenizer)", path.display());
    }
    Ok(r)
}

/// `log softmax(row)`, in f64 for the sum.
fn log_softmax(row: &[f32]) -> Vec<f32> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    let log_sum = sum.ln() as f32;
    row.iter().map(|&v| v - max - log_sum).collect()
}

/// `KL(p ‖ q)` of two log-probability rows.
fn kl(p: &[f32], q: &[f32]) -> f64 {
    p.iter()
        .zip(q)
        .filter(|(lp, _)| lp.is_finite())
        .map(|(&lp, &lq)| f64::from(lp).exp() * (f64::from(lp) - f64::from(lq)))
        .sum::<f64>()
        .max(0.0)
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_sums_to_one_and_kl_of_a_row_with_itself_is_zero() {
        let lp = log_softmax(&[1.0, 2.0, 3.0, -1.0]);
        let total: f64 = lp.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
        assert!(kl(&lp, &lp).abs() < 1e-9);
        let other = log_softmax(&[3.0, 2.0, 1.0, -1.0]);
        assert!(kl(&lp, &other) > 0.1);
        assert_eq!(argmax(&lp), 2);
    }
}
