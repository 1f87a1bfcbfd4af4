//! Which instruction set the kernels run: what the CPU has, capped by
//! `VEIL_KERNELS` (`scalar`, `avx2`, `avx512vnni`), per kernel family.

#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx2_fma() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(target_arch = "x86_64")]
pub(super) fn has_f16c() -> bool {
    has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c")
}

/// AVX-512 VNNI (EPYC Genoa/Turin, Xeon Sapphire Rapids and later; every
/// CPU with it has AVX-512F, BW and VL, checked all the same): `vpdpbusd`
/// does the u8×i8 products and their sums to i32 in one instruction where
/// AVX2 needs two. The Q8_0-activation panels ([`q80_panel_vnni`]) and
/// the K-quants' one-row kernel run it on 512-bit vectors; the K-quants'
/// grouped kernel on 256-bit ones.
#[cfg(target_arch = "x86_64")]
pub(super) fn has_avx512_vnni() -> bool {
    has_avx2_fma()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

/// The kernels a weight format runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Portable Rust: the arithmetic the SIMD kernels are tested against.
    Scalar,
    /// AVX2 and FMA.
    Avx2,
    /// AVX-512 VNNI on 256-bit vectors (with AVX2 and FMA).
    Avx512Vnni,
}

impl Isa {
    /// The name `VEIL_KERNELS` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Scalar => "scalar",
            Self::Avx2 => "avx2",
            Self::Avx512Vnni => "avx512-vnni",
        }
    }
}

/// What `VEIL_KERNELS` asks for, read once: unset gives each format its
/// fastest kernels on this CPU; `avx512-vnni`, `avx2` or `scalar` force
/// that family wherever a format has it and the CPU can run it (the
/// benchmark's A/B). Any other value is warned about, once, and means unset.
pub(super) fn wanted() -> Option<Isa> {
    static WANTED: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| {
        let asked = std::env::var("VEIL_KERNELS").ok()?;
        let isa = parse_isa(&asked);
        if isa.is_none() {
            tracing::warn!(
                value = %asked.escape_debug(),
                "VEIL_KERNELS is not one of avx512-vnni, avx2, scalar; each format runs its default kernels"
            );
        }
        isa
    })
}

/// An [`Isa`] by the name `VEIL_KERNELS` takes.
pub(super) fn parse_isa(name: &str) -> Option<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().find(|isa| isa.name() == name)
}

/// The most this CPU runs of `best`: VNNI needs AVX-512 VNNI and VL, AVX2
/// needs AVX2 and FMA, scalar runs anywhere.
pub(super) fn at_most(best: Isa) -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if best == Isa::Avx512Vnni && has_avx512_vnni() {
            return Isa::Avx512Vnni;
        }
        if best != Isa::Scalar && has_avx2_fma() {
            return Isa::Avx2;
        }
    }
    let _ = best;
    Isa::Scalar
}

/// Q8_0's kernels, and MXFP4's (its blocks are 8-bit blocks with a
/// 4-bit code, so the two formats share one arithmetic: see [`mxfp4`]).
/// VNNI by default where the CPU has it: its grouped kernel
/// ([`q80_matmul_vnni`]) prefilled a Q8_0 model of Llama-3.2-1B's shape
/// 1.6–1.9× faster than the AVX2 kernels on an AMD EPYC (Zen 4) and
/// decoded it as fast. Its arithmetic is the scalar kernel's (each
/// block's exact integer sum, then the float steps of [`sum4`]), not the
/// AVX2 kernels' (eight lanes of fused multiply-adds, summed at the end:
/// fewer instructions a block where a horizontal sum per block costs more
/// than it saves), so a CPU without VNNI rounds Q8_0 and MXFP4 products
/// differently (within float rounding), and replicas of one stage on CPUs
/// of different kinds may differ in the last bits.
pub fn q80_isa() -> Isa {
    at_most(wanted().unwrap_or(Isa::Avx512Vnni))
}

/// Q4_1's kernels: AVX2 unless VNNI is asked for by name. Its VNNI kernels
/// are the AVX2 ones' arithmetic with `vpdpbusd` for the integer products
/// (bit-identical, tested), and prefilled the reference model about 11%
/// slower on Zen 4.
pub fn q41_isa() -> Isa {
    at_most(wanted().unwrap_or(Isa::Avx2))
}

/// The K-quants' kernels (Q4_K, Q5_K, Q6_K): VNNI by default where the
/// CPU has it. Its grouped kernel ([`kquant`]'s `vnni`) and its one-row
/// kernel on 512-bit vectors (`wide`, decode) compute the same exact
/// integers and float steps as the scalar and AVX2 kernels, so all give
/// equal outputs bit for bit (tested).
pub fn kquant_isa() -> Isa {
    at_most(wanted().unwrap_or(Isa::Avx512Vnni))
}

/// Which kernels each format runs, for logs and the benchmark, e.g.
/// `Q8_0/MXFP4 avx512-vnni, Q4_1 avx2, K-quants avx2`.
pub fn kernel_name() -> &'static str {
    static NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME.get_or_init(|| {
        format!("Q8_0/MXFP4 {}, Q4_1 {}, K-quants {}", q80_isa().name(), q41_isa().name(), kquant_isa().name())
    })
}

/// Whether this CPU can run the AVX-512 VNNI kernels.
pub fn vnni_available() -> bool {
    at_most(Isa::Avx512Vnni) == Isa::Avx512Vnni
}
