//! The HTTP surface every party agrees on: the entry's gateway serves it, the
//! host relay forwards it, the client calls it.

/// `GET`: the attestation document (JSON), fresh for `?nonce=<64 hex>`.
pub const ATTESTATION_PATH: &str = "/v1/attestation";
/// `POST`: one sealed request (chunked Oblivious HTTP); the answer is sealed.
pub const SEALED_PATH: &str = "/v1/sealed";
/// `GET`: 200 when every stage has a live, verified replica, else 503.
pub const HEALTH_PATH: &str = "/healthz";
/// `GET`: Prometheus text (counts and timings only, no content).
pub const METRICS_PATH: &str = "/metrics";

/// The body of a Veil host's 404 (relay and entry alike): any other path,
/// including an OpenAI client pointed at the host, learns where to go.
pub const NOT_FOUND_MESSAGE: &str = "unknown endpoint: this is a Veil host, which answers only attestation and \
     sealed requests. Point Veil clients (veil chat, veil verify, the SDK) at its root URL, http(s)://HOST:PORT \
     with no path; point OpenAI clients at `veil proxy URL` running on your own machine, which verifies the \
     route and seals every request.";

/// Paths of the OpenAI-compatible API, inside the seal.
pub mod openai {
    /// `POST`: chat completions.
    pub const CHAT_COMPLETIONS_PATH: &str = "/v1/chat/completions";
    /// `POST`: text completions.
    pub const COMPLETIONS_PATH: &str = "/v1/completions";
    /// `GET`: the served model (and `/v1/models/{id}`).
    pub const MODELS_PATH: &str = "/v1/models";
}

/// Media type of a sealed request (RFC 9458 with chunked bodies).
pub const SEALED_REQUEST_TYPE: &str = "message/ohttp-chunked-req";
/// Media type of a sealed response.
pub const SEALED_RESPONSE_TYPE: &str = "message/ohttp-chunked-res";
/// JSON bodies.
pub const JSON_TYPE: &str = "application/json";

/// The header a client puts on `POST /v1/sealed` (outside the seal) to
/// declare what its request costs in slots ([`request_cost`]): the relay
/// charges the client's share by it, and the entry, which sees the request
/// opened, refuses a request that costs more than it declared. It tells the
/// host how many choices and log-probabilities a request asks for, nothing
/// else of it.
pub const COST_HEADER: &str = "veil-cost";

/// The most a Veil client waits because a `Retry-After` header said so.
/// The header is the host's, unauthenticated: a host that says "in an hour"
/// cannot park a client for longer than this.
pub const MAX_RETRY_AFTER_SECS: u64 = 30;

/// A `Retry-After` value in delta-seconds (the form Veil's relay sends),
/// capped at [`MAX_RETRY_AFTER_SECS`]; an HTTP date or anything else is
/// `None` (the client falls back to its own back-off).
pub fn retry_after_secs(value: &str) -> Option<u64> {
    let v = value.trim();
    if v.is_empty() || v.len() > 10 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    v.parse::<u64>().ok().map(|s| s.min(MAX_RETRY_AFTER_SECS))
}

/// Most choices a request may ask for (OpenAI's `n`).
pub const MAX_CHOICES: u32 = 8;
/// Most top alternatives per position (OpenAI's `top_logprobs`).
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// The highest cost a valid request has.
pub const MAX_COST: u32 = request_cost(MAX_CHOICES, MAX_TOP_LOGPROBS);

/// What a request costs in slots: each choice is a session (one slot), and
/// each ten top log-probabilities per position one more per choice (the
/// last stage ranks the vocabulary for them and the verdict carries them).
/// Arguments past their maxima count as the maxima plus one, so an invalid
/// request still costs more than any valid one.
pub const fn request_cost(choices: u32, top_logprobs: u32) -> u32 {
    let n = if choices == 0 {
        1
    } else if choices > MAX_CHOICES {
        MAX_CHOICES + 1
    } else {
        choices
    };
    let top = if top_logprobs > MAX_TOP_LOGPROBS { MAX_TOP_LOGPROBS + 1 } else { top_logprobs };
    n * (1 + top.div_ceil(10))
}
/// Streamed answers (server-sent events).
pub const EVENT_STREAM_TYPE: &str = "text/event-stream";

/// Inside the sealed answer: the route the request ran on, per stage after
/// the entry `s{stage}r{replica}:{first 8 bytes of the shard's attested TLS
/// key hash, hex}`, comma-separated.
pub const ROUTE_FIELD: &str = "veil-route";
/// Inside the sealed answer: the drafter that ran for this request (`none`
/// when the session did not speculate, else its name and how many rounds
/// carried drafts). What it may be is the attested `drafter` of the route.
pub const DRAFTER_FIELD: &str = "veil-drafter";
/// Inside the sealed answer, the last field of every completed one (a
/// trailer): the entry's signed receipt, JSON
/// (`veil_attestation::receipt::Receipt`).
pub const RECEIPT_FIELD: &str = "veil-receipt";
/// Inside the sealed request: when it was sealed (Unix seconds), for the
/// entry's replay window.
pub const SENT_AT_FIELD: &str = "veil-sent-at";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_capped_delta_seconds_only() {
        assert_eq!(retry_after_secs("3"), Some(3));
        assert_eq!(retry_after_secs(" 0 "), Some(0));
        assert_eq!(retry_after_secs("86400"), Some(MAX_RETRY_AFTER_SECS));
        assert_eq!(retry_after_secs("99999999999999999999"), None);
        for bad in ["", "-1", "1.5", "Wed, 21 Oct 2026 07:28:00 GMT", "3s"] {
            assert_eq!(retry_after_secs(bad), None, "{bad:?}");
        }
    }
}
