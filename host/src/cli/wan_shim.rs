//! `veil-host wan-shim`: run a [`WanShim`] until Ctrl-C.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use tracing::info;

use crate::wan::{LinkShape, WanShim};

/// `veil-host wan-shim`
#[derive(Debug, Args)]
pub struct WanShimArgs {
    /// Address to listen on (port 0 picks a free port; the bound address is logged).
    #[arg(long)]
    pub listen: SocketAddr,
    /// Address to relay each accepted connection to.
    #[arg(long)]
    pub to: SocketAddr,
    /// One-way delay added in each direction, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Uniform jitter (±) on the delay, in milliseconds; bytes are never reordered.
    #[arg(long, default_value_t = 0)]
    pub jitter_ms: u64,
    /// Bandwidth cap per direction, in Mbit/s (10^6 bit/s); unlimited if absent.
    #[arg(long, value_parser = parse_rate_mbit)]
    pub rate_mbit: Option<f64>,
}

impl WanShimArgs {
    /// The link these flags describe.
    pub fn shape(&self) -> LinkShape {
        let shape = LinkShape::IDEAL
            .with_delay(Duration::from_millis(self.delay_ms))
            .with_jitter(Duration::from_millis(self.jitter_ms));
        match self.rate_mbit {
            // `parse_rate_mbit` keeps this at 1 bit/s or more; the cast saturates.
            Some(mbit) => shape.with_rate_bits_per_s((mbit * 1e6).round() as u64),
            None => shape,
        }
    }
}

fn parse_rate_mbit(text: &str) -> Result<f64, String> {
    let mbit: f64 = text.parse().map_err(|e| format!("not a number: {e}"))?;
    if !mbit.is_finite() || mbit * 1e6 < 0.5 {
        return Err("the rate must be a finite number of at least 0.000001 Mbit/s".into());
    }
    Ok(mbit)
}

/// Runs the shim until Ctrl-C, then shuts it down.
pub async fn run(args: WanShimArgs) -> io::Result<()> {
    let shape = args.shape();
    let shim = WanShim::start(args.listen, args.to, shape).await?;
    info!(
        listen = %shim.local_addr(),
        to = %args.to,
        delay_ms = args.delay_ms,
        jitter_ms = args.jitter_ms,
        rate_bits_per_s = ?shape.rate_bits_per_s,
        "wan shim listening; Ctrl-C stops it"
    );
    let signal = tokio::signal::ctrl_c().await;
    info!("stopping wan shim");
    shim.shutdown().await;
    signal
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<WanShimArgs, clap::Error> {
        let cli = Cli::try_parse_from([&["veil-host", "wan-shim"], args].concat())?;
        match cli.command {
            Command::WanShim(args) => Ok(args),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn flags_make_the_link_shape() {
        let args = parse(&[
            "--listen",
            "127.0.0.1:0",
            "--to",
            "127.0.0.1:9000",
            "--delay-ms",
            "30",
            "--jitter-ms",
            "5",
            "--rate-mbit",
            "2.5",
        ])
        .unwrap();
        assert_eq!(
            args.shape(),
            LinkShape {
                delay: Duration::from_millis(30),
                jitter: Duration::from_millis(5),
                rate_bits_per_s: Some(2_500_000)
            }
        );
    }

    #[test]
    fn defaults_to_an_ideal_link() {
        let args = parse(&["--listen", "127.0.0.1:0", "--to", "127.0.0.1:9000"]).unwrap();
        assert_eq!(args.shape(), LinkShape::IDEAL);
    }

    #[test]
    fn rejects_zero_and_non_finite_rates() {
        for rate in ["0", "-1", "inf", "NaN", "fast"] {
            assert!(parse(&["--listen", "127.0.0.1:0", "--to", "127.0.0.1:1", "--rate-mbit", rate]).is_err(), "{rate}");
        }
    }
}
