//! `veil-shard serve`: one shard process (the entry, or a later stage).

use anyhow::Context;

use super::{ServeArgs, EXIT_WEIGHTS_CHANGED};
use crate::attest::{self, Source};

pub(super) fn serve(args: ServeArgs) -> anyhow::Result<()> {
    use crate::pipeline::{entry, route::Route, shard};

    let route = Route::load(&args.config)?;
    let source = match (&route.simulated_root, args.hardware) {
        (_, true) => Source::Hardware { vmpl: 0 },
        (Some(dir), false) => Source::Simulated(dir.clone()),
        (None, false) => anyhow::bail!("the route sets no simulated_root; use --hardware on SEV-SNP"),
    };
    let mut attester = attest::attester(&source)?;
    if args.nvml_gpus {
        #[cfg(feature = "hw")]
        {
            tracing::info!("collecting GPU evidence through NVML with every report");
            attester = Box::new(veil_attestation::gpu::CompositeAttester::new(
                attester,
                veil_attestation::gpu::GpuSource::Nvml(veil_attestation::gpu::hw::NvmlGpuAttester),
            ));
        }
        #[cfg(not(feature = "hw"))]
        anyhow::bail!("--nvml-gpus needs a veil-shard built with `--features hw`");
    } else if route.simulated_gpus > 0 && !args.hardware {
        // Development: this CVM's GPUs are simulated too (fresh device keys
        // per start); one bundle carries CPU and GPU evidence, bound both ways.
        tracing::warn!(gpus = route.simulated_gpus, "using SIMULATED GPUs: GPU evidence proves nothing about hardware");
        let gpus = (0..route.simulated_gpus)
            .map(|_| {
                let seed = veil_attestation::Nonce::random();
                veil_attestation::gpu::simulated::SimulatedGpu::from_seed(seed.as_bytes(), Default::default())
            })
            .collect::<Result<Vec<_>, _>>()?;
        attester = Box::new(veil_attestation::gpu::CompositeAttester::new(
            attester,
            veil_attestation::gpu::GpuSource::Simulated(gpus),
        ));
    }
    let attester: std::sync::Arc<dyn veil_attestation::Attester> = attester.into();
    if args.bind_config {
        check_config_binding(&route, attester.as_ref())?;
    }
    // The entry's sealing key is made before its evidence, which binds the key's hash.
    // A fresh key id per start, so clients holding the previous key get a
    // "wrong key" answer (and re-verify) rather than an undecryptable request.
    let key_id = veil_attestation::Nonce::random().as_bytes()[0];
    let seal_key = (args.stage == 0).then(|| crate::gateway::seal::SealKey::generate(key_id)).transpose()?;
    let evidence = if args.hardware { shard::Evidence::Hardware } else { shard::Evidence::Simulated };
    let loaded =
        shard::load(&route, args.stage, attester.as_ref(), seal_key.as_ref().map(|k| k.config_hash()), evidence)?;
    if let Some(every) = route.weight_recheck {
        shard::watch_weights(loaded.slice.clone(), every, |why| {
            tracing::error!(%why, "stopping: this shard's weights are no longer the ones it attested");
            std::process::exit(i32::from(EXIT_WEIGHTS_CHANGED));
        })?;
    }
    if args.supervised {
        // The supervisor holds our stdin; when it goes away, so do we.
        std::thread::spawn(|| {
            let mut sink = Vec::new();
            let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
            tracing::info!("supervisor gone (stdin closed): exiting");
            std::process::exit(0);
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        if args.stage > 0 {
            return shard::serve(route, args.stage, args.replica, loaded, args.listen).await;
        }
        let tokenizer = loaded.tokenizer.context("the entry's tokenizer was not loaded")?;
        let addr = route.stages[0].replicas[0];
        let gen_addr = route.generate_listen;
        let listener =
            tokio::net::TcpListener::bind(gen_addr).await.with_context(|| format!("listening on {gen_addr}"))?;
        let sealed_addr = route.sealed_listen;
        let model_name = route.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let draft_model = match &route.speculation.draft_model {
            None => None,
            Some(path) => {
                let m = crate::speculate::model::DraftModel::load(path, &tokenizer)
                    .with_context(|| format!("loading the draft model {}", path.display()))?;
                tracing::info!(draft = %m.name(), "draft model loaded for speculative decoding");
                Some(std::sync::Arc::new(m))
            }
        };
        let e = entry::Entry::start(route, loaded.slice, tokenizer, loaded.trust, draft_model);
        tracing::info!(%addr, generate = %gen_addr, "entry up; internal generate endpoint on loopback");
        if let (Some(sealed), Some(key)) = (sealed_addr, seal_key) {
            let listener =
                tokio::net::TcpListener::bind(sealed).await.with_context(|| format!("listening on {sealed}"))?;
            let gw = crate::gateway::server::Gateway::new(
                e.clone(),
                key,
                attester,
                loaded.claims,
                model_name,
                loaded.policy,
                loaded.shape,
            );
            tracing::info!(%sealed, "gateway: sealed requests and evidence (ciphertext only)");
            tokio::spawn(std::sync::Arc::new(gw).serve(listener));
        }
        let waiting = e.clone();
        tokio::spawn(async move {
            while !waiting.ready().await {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            tracing::info!("every stage has a verified shard: ready");
        });
        entry::serve_generate(e, listener).await;
        Ok(())
    })
}

/// `--bind-config`: this shard's own report must carry, in HOST_DATA, the
/// digest of the route and peer policy it was handed.
fn check_config_binding(
    route: &crate::pipeline::route::Route,
    attester: &dyn veil_attestation::Attester,
) -> anyhow::Result<()> {
    let policy = super::read_policy(&route.policy)?;
    let want = route.config_digest(&policy);
    let claims = veil_attestation::Claims { software_version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
    let bundle = attester.evidence(&claims).context("reading this shard's own report")?;
    let report = veil_attestation::snp::SnpReport::from_bytes(&bundle.report)
        .map_err(|e| anyhow::anyhow!("this shard's own report: {e}"))?;
    if report.host_data() != want {
        anyhow::bail!(
            "HOST_DATA {} does not commit to this route and peer policy (their digest is {}): \
             the configuration was not the one this guest was launched for",
            hex::encode(report.host_data()),
            hex::encode(want)
        );
    }
    tracing::info!(host_data = %hex::encode(want), "HOST_DATA commits to this route and its peer policy");
    Ok(())
}
