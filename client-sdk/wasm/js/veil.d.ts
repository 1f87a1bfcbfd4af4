// Types of veil.js: the Veil client for browsers and Node.

/** Every failure; `kind` says whose fault it is. */
export interface VeilError extends Error {
  name: "VeilError";
  kind: "config" | "unreachable" | "protocol" | "attestation" | "route_rejected" | "refused" | "api" | "truncated" | "receipt";
  /** The failed check table, for attestation and route_rejected. */
  checks: string | null;
  /** The shard whose evidence failed, for attestation. */
  who: string | null;
  /** The HTTP status, for refused and api. */
  status?: number;
}

export interface ChatMessage {
  role: string;
  content: string;
}

export interface VerifyOptions {
  /** A fetch to use instead of globalThis.fetch. */
  fetch?: typeof fetch;
  /** The WebAssembly module's bytes or URL (default: next to veil.js). */
  wasm?: BufferSource | URL | string;
  /**
   * Times a request shed for load (429 or 503, the host's or the entry's) is
   * sealed again and re-sent, after the host's Retry-After (at most 30 s) and
   * a jittered, doubling back-off (default 3; 0 never).
   */
  retries?: number;
}

/** Loads the WebAssembly module once (Veil.verify calls it). */
export function load(wasm?: BufferSource | URL | string): Promise<unknown>;

export declare const Veil: {
  /** Fetches the route's attestation with a fresh nonce and verifies every shard against the policy (TOML text). */
  verify(url: string, policy: string, options?: VerifyOptions): Promise<VerifiedRoute>;
};

export declare class VerifiedRoute {
  readonly url: string;
  /** Re-sends of a request shed for load (VerifyOptions.retries). */
  readonly retries: number;
  /** Every shard's check table and the route's, as `veil verify` prints them. */
  readonly checks: string;
  /** The document `veil verify --json` prints. */
  readonly json: Record<string, unknown>;
  readonly simulated: boolean;
  readonly warnings: string[];
  readonly model: string;
  /** A chat answer streamed as text pieces, ending only at the seal's authenticated end. */
  chat(messages: ChatMessage[], params?: Record<string, unknown>): ChatStream;
  /** The whole answer's text. */
  chatText(messages: ChatMessage[], params?: Record<string, unknown>): Promise<string>;
}

export declare class ChatStream implements AsyncIterable<string> {
  /** `stop` or `length`, once the stream has ended. */
  readonly finishReason: string | null;
  /** The entry's signed receipt for this answer, checked (fields as `veil receipt verify` reads them), once the stream has ended. */
  readonly receipt: Record<string, unknown> | null;
  [Symbol.asyncIterator](): AsyncIterator<string>;
}
