//! How a matrix product is spread over threads: weight rows split across
//! threads for decode, tiles of input rows × weight rows for prefill, and
//! the grouped kernels' panels of weight rows. Every output is one
//! sequential dot, so results do not depend on the thread count or on
//! batching. The kernels (`super`) say what one dot computes.

use rayon::prelude::*;

/// Output rows handed to one task: enough work to amortise a steal.
const ROWS_PER_TASK: usize = 16;

/// Bytes of quantized input rows one prefill task holds: well inside the
/// smallest per-core L2 of the CPUs Veil targets (512 KiB on AMD Zen 3; Zen 4
/// has 1 MiB), the weight rows streaming past beside them.
const TASK_INPUT_BYTES: usize = 384 << 10;

/// `out[i][j] = dot(w row j, x row i)` for `m` input rows of `row_bytes`
/// each, `one` giving a single input row's dot and `sweep(w row, first, n,
/// out, stride)` those of input rows `first..first + n` (`first` a multiple
/// of 16), written at `out[i * stride]`: [`par_panels`] one weight row at a
/// time.
pub(super) fn par_tiles<W: Sync>(
    w: &[W],
    rows: usize,
    per_row: usize,
    m: usize,
    row_bytes: usize,
    one: impl Fn(&[W]) -> f32 + Sync,
    sweep: impl Fn(&[W], usize, usize, &mut [f32], usize) + Sync,
) -> Vec<f32> {
    let wrow = |j: usize| &w[j * per_row..(j + 1) * per_row];
    let panel = |js: std::ops::Range<usize>, first: usize, n: usize, out: &mut [f32]| {
        for (j, o) in js.zip(out.chunks_exact_mut(n)) {
            sweep(wrow(j), first, n, o, 1);
        }
    };
    par_panels(w, rows, per_row, m, row_bytes, one, panel)
}

/// `out[i][j] = dot(w row j, x row i)` for `m` input rows of `row_bytes`
/// each, `one` giving a single input row's dot and `panel(js, first, n,
/// out)` the dots of weight rows `js` with input rows `first..first + n`
/// (`first` a multiple of 16), weight row after weight row (`out[k * n + i]`
/// for weight row `js.start + k`). Few input rows (decode): weight rows are
/// split across threads. Many (prefill, batches): input rows are, and each
/// task sweeps the whole weight, the weight rows of a panel staying in L1
/// while the task's input rows pass them. Every output is one sequential
/// dot, so results do not depend on the thread count or on batching.
pub(super) fn par_panels<W: Sync>(
    w: &[W],
    rows: usize,
    per_row: usize,
    m: usize,
    row_bytes: usize,
    one: impl Fn(&[W]) -> f32 + Sync,
    panel: impl Fn(std::ops::Range<usize>, usize, usize, &mut [f32]) + Sync,
) -> Vec<f32> {
    let wrow = |j: usize| &w[j * per_row..(j + 1) * per_row];
    let mut out = vec![0f32; m * rows];
    let threads = rayon::current_num_threads();
    if m < 4 * threads {
        if m == 1 {
            out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(c, o)| {
                for (r, v) in o.iter_mut().enumerate() {
                    *v = one(wrow(c * ROWS_PER_TASK + r));
                }
            });
            return out;
        }
        let mut t = vec![0f32; rows * m];
        t.par_chunks_mut(ROWS_PER_TASK * m).enumerate().for_each(|(c, o)| {
            let j0 = c * ROWS_PER_TASK;
            panel(j0..j0 + o.len() / m, 0, m, o);
        });
        for (i, row) in out.chunks_exact_mut(rows).enumerate() {
            for (j, v) in row.iter_mut().enumerate() {
                *v = t[j * m + i];
            }
        }
        return out;
    }
    // Tasks are tiles: a chunk of input rows (as many as stay in L2 while
    // they are swept once per panel of weight rows: wide matrices, 8192
    // inputs at 9 KiB a row, get fewer) times a range of weight rows. Chunks
    // as large as that allows keep the weights streamed the fewest times;
    // ranges of weight rows give every thread several tasks.
    let most = (TASK_INPUT_BYTES / row_bytes.max(1)).clamp(16, 64) / 16 * 16;
    let chunk = m.next_multiple_of(16).min(most);
    let chunks = m.div_ceil(chunk);
    let ranges = (4 * threads).div_ceil(chunks).clamp(1, rows.div_ceil(ROWS_PER_TASK));
    let per_range = rows.div_ceil(ranges).next_multiple_of(PANEL_ROWS);
    let tiles: Vec<(usize, usize)> =
        (0..chunks).flat_map(|c| (0..rows.div_ceil(per_range)).map(move |r| (c, r))).collect();
    let parts: Vec<Vec<f32>> = tiles
        .par_iter()
        .map(|&(c, r)| {
            let (first, n) = (c * chunk, chunk.min(m - c * chunk));
            let js = r * per_range..((r + 1) * per_range).min(rows);
            let mut o = vec![0f32; n * js.len()];
            panel(js, first, n, &mut o);
            o
        })
        .collect();
    // Each tile's outputs are weight row after weight row: written to the
    // output an input row at a time, contiguously.
    for (&(c, r), o) in tiles.iter().zip(&parts) {
        let (first, n) = (c * chunk, chunk.min(m - c * chunk));
        let width = o.len() / n;
        for i in 0..n {
            let row = &mut out[(first + i) * rows + r * per_range..][..width];
            for (k, v) in row.iter_mut().enumerate() {
                *v = o[k * n + i];
            }
        }
    }
    out
}

/// Weight rows `js` against the input rows of `groups` groups of sixteen
/// (`n` of them real), written weight row after weight row into `out`
/// (`out[k * n + i]`, as [`par_panels`] hands it): [`PANEL_ROWS`] rows at
/// a time by `four(first row, lanes)`, the rows left over one at a time by
/// `one(row, lanes)`, each writing lane block `r * groups + g` of `lanes`.
#[cfg(target_arch = "x86_64")]
pub(super) fn run_panels(
    js: std::ops::Range<usize>,
    n: usize,
    groups: usize,
    out: &mut [f32],
    four: impl Fn(usize, &mut [[f32; 16]]),
    one: impl Fn(usize, &mut [[f32; 16]]),
) {
    if groups == 0 {
        return;
    }
    let mut lanes = vec![[0f32; 16]; PANEL_ROWS * groups];
    let mut j = js.start;
    while j < js.end {
        let r = if j + PANEL_ROWS <= js.end {
            four(j, &mut lanes);
            PANEL_ROWS
        } else {
            one(j, &mut lanes);
            1
        };
        for (t, row) in lanes.chunks_exact(groups).take(r).enumerate() {
            out[(j - js.start + t) * n..][..n].copy_from_slice(&row.as_flattened()[..n]);
        }
        j += r;
    }
}

/// Weight rows a grouped kernel runs at once ([`par_panels`] makes its
/// ranges of weight rows multiples of it).
pub(super) const PANEL_ROWS: usize = 4;
