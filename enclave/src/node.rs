//! One Veil node — a shard of a route, or its entry — assembled as a library:
//! the attester (simulated or SEV-SNP, with GPUs), the optional HOST_DATA
//! check of the configuration, the entry's sealing key, the verified slice
//! and links, and then the servers. `veil-shard serve` is this plus process
//! concerns (exit codes, the supervisor's pipe); tests and benchmarks start
//! nodes in-process with the same code.
//!
//! ```text
//!  Node::load: attester ─▶ [--bind-config: own report's HOST_DATA = Route::config_digest]
//!              ─▶ seal key (entry) ─▶ shard::load (slice, manifest, claims, Trust)
//!  Node::serve: stage > 0 ─▶ shard::serve (data + control links)
//!               stage 0   ─▶ Entry::start ─▶ Gateway (sealed) + loopback endpoint
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use veil_attestation::Attester;

use crate::error::{Error, Result};
use crate::gateway::seal::SealKey;
use crate::gpu_reference::ReferenceFiles;
use crate::pipeline::route::Route;
use crate::pipeline::shard::{self, Loaded};
use crate::pipeline::{entry, net::Trust};

/// Where a node's evidence comes from.
#[derive(Clone, Debug)]
pub enum Attestation {
    /// Veil's simulated root in this directory (development), with this many simulated GPUs.
    Simulated {
        /// The simulated root.
        root: PathBuf,
        /// Simulated GPUs presented with every report.
        gpus: u32,
    },
    /// The SEV-SNP guest (configfs-tsm); with `nvml_gpus`, every GPU NVML sees.
    Hardware {
        /// Collect GPU evidence through NVML (feature `hw`).
        nvml_gpus: bool,
        /// NVIDIA's RIMs and OCSP responses for the GPUs, carried in every
        /// bundle for the client's verifier (`--gpu-rim`, `--gpu-ocsp`,
        /// `--gpu-reference`).
        reference: ReferenceFiles,
        /// Read `reference` again this often (`--gpu-reference-refresh`), so
        /// OCSP responses the operator renews reach clients without a restart.
        refresh: Option<std::time::Duration>,
    },
}

impl Attestation {
    /// The route's choice: its simulated root, or hardware when `hardware`.
    pub fn for_route(
        route: &Route,
        hardware: bool,
        nvml_gpus: bool,
        reference: ReferenceFiles,
        refresh: Option<std::time::Duration>,
    ) -> Result<Self> {
        match (&route.simulated_root, hardware) {
            (_, true) => Ok(Self::Hardware { nvml_gpus, reference, refresh }),
            (Some(root), false) => Ok(Self::Simulated { root: root.clone(), gpus: route.simulated_gpus }),
            (None, false) => Err(Error::Config("the route sets no simulated_root; use --hardware on SEV-SNP".into())),
        }
    }

    fn attester(&self) -> Result<Arc<dyn Attester>> {
        use crate::attest::{self, Source};
        match self {
            #[cfg(not(feature = "hw"))]
            Self::Hardware { .. } => Err(Error::Config(
                "--hardware: this veil-shard was built without SEV-SNP support; rebuild it with \
                 `cargo build --release --locked --features veil-enclave/hw` (and `cuda` for GPUs)"
                    .into(),
            )),
            #[cfg(feature = "hw")]
            Self::Hardware { nvml_gpus, reference, refresh } => {
                let cpu = attest::attester(&Source::Hardware { vmpl: 0 })?;
                if !nvml_gpus {
                    return Ok(cpu.into());
                }
                // Refused at start when a verifier would refuse it.
                let material = reference.load()?;
                tracing::info!(
                    rims = material.rims.len(),
                    ocsp = material.ocsp.len(),
                    "collecting GPU evidence through NVML with every report"
                );
                let attester = veil_attestation::attester::gpu::CompositeAttester::new(
                    cpu,
                    veil_attestation::attester::gpu::GpuSource::Nvml(
                        veil_attestation::attester::gpu::hw::NvmlGpuAttester,
                    ),
                )?
                .carrying(material)
                .map_err(|e| Error::Config(format!("GPU reference material: {e}")))?;
                if let Some(every) = refresh.filter(|_| !reference.is_empty()) {
                    reference.clone().spawn_refresh(attester.carried(), every)?;
                }
                Ok(Arc::new(attester))
            }
            Self::Simulated { root, gpus } => {
                let cpu = attest::attester(&Source::Simulated(root.clone()))?;
                if *gpus == 0 {
                    return Ok(cpu.into());
                }
                // Development: this CVM's GPUs are simulated too (fresh device keys
                // per start); one bundle carries CPU and GPU evidence, bound both ways.
                tracing::warn!(gpus, "using SIMULATED GPUs: GPU evidence proves nothing about hardware");
                let devices = (0..*gpus)
                    .map(|_| {
                        let seed = veil_attestation::Nonce::random();
                        veil_attestation::attester::gpu::simulated::SimulatedGpu::from_seed(
                            seed.as_bytes(),
                            Default::default(),
                        )
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Arc::new(veil_attestation::attester::gpu::CompositeAttester::new(
                    cpu,
                    veil_attestation::attester::gpu::GpuSource::Simulated(devices),
                )?))
            }
        }
    }
}

/// How to run one node of a route.
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// Stage to serve (0 = the entry).
    pub stage: usize,
    /// Which of the stage's replica addresses this node is.
    pub replica: usize,
    /// Where evidence comes from.
    pub attestation: Attestation,
    /// Refuse to start unless this node's HOST_DATA commits to the route and peer policy.
    pub bind_config: bool,
    /// Listen here instead of on the replica's address (stages after the entry).
    pub listen: Option<SocketAddr>,
    /// Compute here instead of on the route stage's device.
    pub device: Option<crate::model::ComputeDevice>,
    /// Where the entry compiles clients' response formats (worker processes
    /// of `veil-shard` in production).
    pub format_worker: crate::pipeline::entry::format_jobs::FormatWorker,
}

/// A node with its slice loaded and verified, ready to serve.
pub struct Node {
    route: Route,
    options: NodeOptions,
    attester: Arc<dyn Attester>,
    seal_key: Option<SealKey>,
    loaded: Loaded,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("stage", &self.options.stage).field("replica", &self.options.replica).finish()
    }
}

impl Node {
    /// Makes the attester, checks the configuration binding when asked,
    /// makes the entry's sealing key, and loads the stage's slice (refusing
    /// weights whose manifest root is not the route's).
    pub fn load(route: Route, options: NodeOptions) -> Result<Self> {
        let attester = options.attestation.attester()?;
        if options.bind_config {
            check_config_binding(&route, attester.as_ref())?;
        }
        // The entry's sealing key is made before its evidence, which binds the key's hash.
        // A fresh key id per start, so clients holding the previous key get a
        // "wrong key" answer (and re-verify) rather than an undecryptable request.
        let key_id = veil_attestation::Nonce::random().as_bytes()[0];
        let seal_key = (options.stage == 0).then(|| SealKey::generate(key_id)).transpose()?;
        let evidence = match options.attestation {
            Attestation::Hardware { .. } => shard::Evidence::Hardware,
            Attestation::Simulated { .. } => shard::Evidence::Simulated,
        };
        let device = options.device.unwrap_or(route.stages.get(options.stage).map(|s| s.device).unwrap_or_default());
        if device.is_gpu() {
            gpu_gate(device, &options.attestation)?;
        }
        let loaded = shard::load(
            &route,
            options.stage,
            device,
            attester.as_ref(),
            seal_key.as_ref().map(|k| k.config_hash()),
            evidence,
        )?;
        Ok(Self { route, options, attester, seal_key, loaded })
    }

    /// Re-hashes the resident weights every `weight_recheck_s` of the route
    /// and calls `on_change` (on its own thread) when they no longer hash as
    /// loaded; no watch when the route turns it off.
    pub fn watch_weights(&self, on_change: impl FnOnce(String) + Send + 'static) -> Result<()> {
        if let Some(every) = self.route.weight_recheck {
            shard::watch_weights(self.loaded.slice.clone(), every, on_change)
                .map_err(Error::io("starting the weight watch"))?;
        }
        Ok(())
    }

    /// Our attested identity and the peer policy.
    pub fn trust(&self) -> &Arc<Trust> {
        &self.loaded.trust
    }

    /// Serves until the process ends (or an error stops it): a shard's link
    /// server, or the entry's control links, gateway and loopback endpoint.
    pub async fn serve(self) -> Result<()> {
        let Self { route, options, attester, seal_key, loaded } = self;
        if options.stage > 0 {
            return shard::serve(route, options.stage, options.replica, loaded, options.listen).await;
        }
        let tokenizer =
            loaded.tokenizer.ok_or_else(|| Error::Internal("the entry's tokenizer was not loaded".into()))?;
        let addr = route.stages[0].replicas[0];
        let gen_addr = route.generate_listen;
        let listener =
            tokio::net::TcpListener::bind(gen_addr).await.map_err(Error::io(format!("listening on {gen_addr}")))?;
        let sealed_addr = route.sealed_listen;
        let model_name = route.model.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        let draft_model = match &route.speculation.draft_model {
            None => None,
            Some(path) => {
                let m = crate::speculate::model::DraftModel::load(path, &tokenizer)
                    .map_err(|e| Error::Config(format!("the draft model {}: {e}", path.display())))?;
                tracing::info!(draft = %m.name(), "draft model loaded for speculative decoding");
                Some(Arc::new(m))
            }
        };
        let drafter = drafter_info(&route.speculation, draft_model.as_deref());
        let e = entry::Entry::start(
            route,
            loaded.slice,
            tokenizer,
            loaded.trust,
            draft_model,
            options.format_worker.clone(),
        );
        tracing::info!(%addr, generate = %gen_addr, "entry up; internal generate endpoint on loopback");
        if let (Some(sealed), Some(key)) = (sealed_addr, seal_key) {
            let listener =
                tokio::net::TcpListener::bind(sealed).await.map_err(Error::io(format!("listening on {sealed}")))?;
            let gw = crate::gateway::server::Gateway::new(
                e.clone(),
                key,
                attester,
                loaded.claims,
                model_name,
                loaded.policy,
                loaded.shape,
                drafter,
            )
            .map_err(Error::Internal)?;
            tracing::info!(%sealed, "gateway: sealed requests and evidence (ciphertext only)");
            tokio::spawn(Arc::new(gw).serve(listener));
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
    }
}

/// What the entry commits to about its drafter: the route's default kind,
/// the draft model's manifest root, and the k settings.
fn drafter_info(
    spec: &crate::pipeline::route::Speculation,
    model: Option<&crate::speculate::model::DraftModel>,
) -> veil_attestation::route::DrafterInfo {
    veil_attestation::route::DrafterInfo {
        kind: spec.drafter.name().to_owned(),
        draft_manifest: model.map(|m| veil_attestation::ManifestRoot(m.manifest_root())),
        k_max: u32::try_from(spec.k_max).unwrap_or(u32::MAX),
        k: spec.k.map(|k| u32::try_from(k).unwrap_or(u32::MAX)),
    }
}

/// SECURITY-CASES F8: before any weight reaches a GPU, the GPU must be one
/// this node's evidence names, in confidential-computing mode (not
/// devtools) and in the ready state. With simulated attestation there is no
/// hardware to ask; that is said loudly.
fn gpu_gate(device: crate::model::ComputeDevice, attestation: &Attestation) -> Result<()> {
    let crate::model::ComputeDevice::Cuda(index) = device else { return Ok(()) };
    match attestation {
        Attestation::Simulated { .. } => {
            tracing::warn!(%device, "SIMULATED attestation: the GPU ready-state gate is not checked (development only)");
            Ok(())
        }
        #[cfg(feature = "hw")]
        Attestation::Hardware { nvml_gpus, .. } => {
            if !nvml_gpus {
                return Err(Error::Config(format!(
                    "{device}: computing on a GPU needs its evidence in every report (--nvml-gpus)"
                )));
            }
            // CUDA numbers GPUs fastest-first unless told otherwise; the
            // evidence numbers them in PCI order (NVML). Make them the same,
            // and refuse a remapping the evidence would not show.
            if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
                return Err(Error::Refused(
                    "CUDA_VISIBLE_DEVICES is set: CUDA's GPU numbers would differ from the evidence's".into(),
                ));
            }
            std::env::set_var("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
            let uuid = veil_attestation::attester::gpu::hw::ready_gate(index as u32)
                .map_err(|e| Error::Refused(format!("{device}: {e}")))?;
            tracing::info!(%device, %uuid, "GPU gate: named by the evidence, CC mode on, ready state set");
            Ok(())
        }
        #[cfg(not(feature = "hw"))]
        Attestation::Hardware { .. } => Err(Error::Config(format!(
            "GPU {index} ({device}) with hardware attestation needs a veil-shard built with \
             `--features hw`: the GPU ready-state gate reads NVML"
        ))),
    }
}

/// `bind_config`: this node's own report must carry, in HOST_DATA, the
/// digest of the route and peer policy it was handed.
fn check_config_binding(route: &Route, attester: &dyn Attester) -> Result<()> {
    let policy = shard::load_policy(&route.policy)?;
    let want = route.config_digest(&policy);
    let claims = veil_attestation::Claims { software_version: env!("CARGO_PKG_VERSION").into(), ..Default::default() };
    let bundle = attester.evidence(&claims)?;
    let report = veil_attestation::snp::SnpReport::from_bytes(&bundle.report)
        .map_err(|e| Error::Refused(format!("this shard's own report does not parse: {e}")))?;
    if report.host_data() != want {
        return Err(Error::Refused(format!(
            "HOST_DATA {} does not commit to this route and peer policy (their digest is {}): \
             the configuration was not the one this guest was launched for",
            hex::encode(report.host_data()),
            hex::encode(want)
        )));
    }
    tracing::info!(host_data = %hex::encode(want), "HOST_DATA commits to this route and its peer policy");
    Ok(())
}
