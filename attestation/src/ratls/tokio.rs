//! Tokio helpers: mutual RA-TLS over a TCP stream, then the channel binding.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::{
    client_config, error_from_rustls, server_config, RaTlsIdentity, RaTlsVerifier, Role, VerifiedPeer, EXPORTER_LABEL,
    MAX_BINDING_SIGNATURE, MAX_POST_HANDSHAKE_GPU_BYTES,
};
use crate::error::Error;

/// A client-side RA-TLS stream.
pub type ClientStream = tokio_rustls::client::TlsStream<TcpStream>;
/// A server-side RA-TLS stream.
pub type ServerStream = tokio_rustls::server::TlsStream<TcpStream>;

/// TLS 1.3 check, the peer's certificate and this connection's exporter value.
fn binding_inputs<D>(conn: &rustls::ConnectionCommon<D>) -> Result<(Vec<u8>, [u8; 32]), Error> {
    match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => {}
        other => return Err(Error::PeerMisbehaved(format!("RA-TLS requires TLS 1.3, negotiated {other:?}"))),
    }
    let ekm = conn
        .export_keying_material([0u8; 32], EXPORTER_LABEL, None)
        .map_err(|e| Error::PeerMisbehaved(e.to_string()))?;
    Ok((peer_cert(conn)?, ekm))
}

/// After the handshake, both ways at once (neither side waits for the other
/// to read): `u16` length ‖ binding signature ‖ `u32` length ‖ GPU evidence
/// (JSON; length 0 without GPUs). Returns the peer's signature and GPU evidence.
async fn exchange_binding<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    identity: &RaTlsIdentity,
    role: Role,
    exporter: &[u8],
) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let sig = identity.sign_binding(role, exporter);
    let gpus = identity.post_handshake_gpus();
    let len = u16::try_from(sig.len()).map_err(|_| Error::ApiMisuse("binding signature too long".into()))?;
    let gpu_len = u32::try_from(gpus.len()).map_err(|_| Error::ApiMisuse("GPU evidence too long".into()))?;
    let mut out = Vec::with_capacity(6 + sig.len() + gpus.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&sig);
    out.extend_from_slice(&gpu_len.to_be_bytes());
    out.extend_from_slice(&gpus);
    let (mut rd, mut wr) = tokio::io::split(stream);
    let send = async {
        wr.write_all(&out).await?;
        wr.flush().await?;
        Ok::<_, Error>(())
    };
    let receive = async {
        let peer_len = usize::from(rd.read_u16().await?);
        if peer_len == 0 || peer_len > MAX_BINDING_SIGNATURE {
            return Err(Error::PeerMisbehaved(format!("channel-binding signature of {peer_len} bytes")));
        }
        let mut peer_sig = vec![0u8; peer_len];
        rd.read_exact(&mut peer_sig).await?;
        let gpu_len = usize::try_from(rd.read_u32().await?).unwrap_or(usize::MAX);
        if gpu_len > MAX_POST_HANDSHAKE_GPU_BYTES {
            return Err(Error::PeerMisbehaved(format!(
                "{gpu_len} bytes of GPU evidence (at most {MAX_POST_HANDSHAKE_GPU_BYTES})"
            )));
        }
        let mut peer_gpus = vec![0u8; gpu_len];
        rd.read_exact(&mut peer_gpus).await?;
        Ok((peer_sig, peer_gpus))
    };
    let (sent, received) = tokio::join!(send, receive);
    sent?;
    received
}

fn peer_cert(conn: &rustls::CommonState) -> Result<Vec<u8>, Error> {
    conn.peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .ok_or_else(|| Error::PeerMisbehaved("peer presented no certificate".into()))
}

/// Connects over `tcp`, verifies the server's evidence, proves ours, and
/// checks the channel binding both ways.
pub async fn connect(
    tcp: TcpStream,
    identity: &RaTlsIdentity,
    verifier: Arc<RaTlsVerifier>,
) -> Result<(ClientStream, VerifiedPeer), Error> {
    let config = client_config(identity, verifier.clone())?;
    let name =
        rustls::pki_types::ServerName::try_from("veil-shard.invalid").map_err(|e| Error::ApiMisuse(e.to_string()))?;
    let mut tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(io_or_tls)?;
    let (cert, ekm) = binding_inputs(tls.get_ref().1)?;
    let (peer_sig, peer_gpus) = exchange_binding(&mut tls, identity, Role::Client, &ekm).await?;
    let peer = VerifiedPeer::establish(&verifier, &cert, Role::Server, &ekm, &peer_sig, &peer_gpus)?;
    Ok((tls, peer))
}

/// Accepts over `tcp`: the server half of [`connect`].
pub async fn accept(
    tcp: TcpStream,
    identity: &RaTlsIdentity,
    verifier: Arc<RaTlsVerifier>,
) -> Result<(ServerStream, VerifiedPeer), Error> {
    let config = server_config(identity, verifier.clone())?;
    let mut tls = TlsAcceptor::from(Arc::new(config)).accept(tcp).await.map_err(io_or_tls)?;
    let (cert, ekm) = binding_inputs(tls.get_ref().1)?;
    let (peer_sig, peer_gpus) = exchange_binding(&mut tls, identity, Role::Server, &ekm).await?;
    let peer = VerifiedPeer::establish(&verifier, &cert, Role::Client, &ekm, &peer_sig, &peer_gpus)?;
    Ok((tls, peer))
}

fn io_or_tls(e: std::io::Error) -> Error {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(tls) => error_from_rustls(tls),
        None => Error::Io(e),
    }
}
