//! `veil-shard serve`: one node of a route in this process
//! ([`crate::node::Node`]), plus what belongs to a process: exiting when the
//! resident weights change (status 70) or the supervisor goes away.

use super::{ServeArgs, EXIT_WEIGHTS_CHANGED};
use std::time::Duration;

use crate::gpu_reference::ReferenceFiles;
use crate::node::{Attestation, Node, NodeOptions};
use crate::pipeline::route::Route;

pub(super) fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let route = Route::load(&args.config)?;
    let reference =
        ReferenceFiles { rims: args.gpu_rims.clone(), ocsp: args.gpu_ocsp.clone(), dir: args.gpu_reference.clone() };
    let refresh = (args.gpu_reference_refresh > 0).then(|| Duration::from_secs(args.gpu_reference_refresh));
    let options = NodeOptions {
        stage: args.stage,
        replica: args.replica,
        attestation: Attestation::for_route(&route, args.hardware, args.nvml_gpus, reference, refresh)?,
        bind_config: args.bind_config,
        listen: args.listen,
        device: args.device,
        format_worker: crate::pipeline::entry::format_jobs::FormatWorker::this_executable(),
    };
    let node = Node::load(route, options)?;
    node.watch_weights(|why| {
        tracing::error!(%why, "stopping: this shard's weights are no longer the ones it attested");
        std::process::exit(i32::from(EXIT_WEIGHTS_CHANGED));
    })?;
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
    Ok(runtime.block_on(node.serve())?)
}
