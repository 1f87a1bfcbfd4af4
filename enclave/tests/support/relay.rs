//! A host relay test double: forwards every HTTP request to the entry's
//! gateway and lets the test play the host at that interface — replay a
//! request, count what passes, rewrite any answer before the client sees it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};

/// What the host does to the traffic it relays.
pub trait Tamper: Send + Sync + 'static {
    /// How many times to send this request to the gateway (the client gets
    /// the last answer); called once per request, so it can also count.
    fn sends(&self, _path: &str) -> usize {
        1
    }
    /// Rewrites the gateway's answer to `path` in place.
    fn answer(&self, path: &str, status: hyper::StatusCode, body: &mut Vec<u8>);
}

/// Starts the relay on a free loopback port; returns its address.
pub async fn tampering_host(gateway: SocketAddr, tamper: Arc<dyn Tamper>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind(veil_tests::free_loopback_port()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http::<Full<Bytes>>();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (client, tamper) = (client.clone(), tamper.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let (client, tamper) = (client.clone(), tamper.clone());
                    async move {
                        let path = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
                        let method = req.method().clone();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let forward = || {
                            hyper::Request::builder()
                                .method(method.clone())
                                .uri(format!("http://{gateway}{path}"))
                                .body(Full::new(body.clone()))
                                .unwrap()
                        };
                        for _ in 1..tamper.sends(&path) {
                            let earlier = client.request(forward()).await.unwrap();
                            let _ = earlier.into_body().collect().await;
                        }
                        let resp = client.request(forward()).await.unwrap();
                        let status = resp.status();
                        let mut bytes = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
                        tamper.answer(&path, status, &mut bytes);
                        let mut r = hyper::Response::new(Full::new(Bytes::from(bytes)));
                        *r.status_mut() = status;
                        Ok::<_, std::convert::Infallible>(r)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    addr
}
