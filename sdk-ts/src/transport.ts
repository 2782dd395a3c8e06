/**
 * One op call over `fetch`, with its retries.
 *
 * A read is sent again after a connection error, a timeout, a 503 or a 429. Every call that
 * is not a read carries an `Idempotency-Key`, the same on each try: Loom applies a keyed
 * write once however often it is sent, so it is sent again after the same failures and after
 * `409 IDEMPOTENCY_IN_PROGRESS`. What each answer to a keyed write means:
 *
 * - 200 (or any other answer of the op): applied once, whichever try it answers;
 * - 409 `IDEMPOTENCY_IN_PROGRESS`: a try with this key is still running (or its process died
 *   and its short lease has not run out yet); sent again after Retry-After, and answered by
 *   that try's outcome once it ends: its answer, or, when it never ran, the write run now;
 * - 503, a reset or a timeout: unknown from here, but safe to send again with the same key,
 *   which settles it;
 * - 409 `IDEMPOTENCY_OUTCOME_UNKNOWN`: an op whose answer is a step of its own ended without
 *   one and may have been applied; never sent again: read the state, then write anew;
 * - 422 `IDEMPOTENCY_KEY_REUSED`: the key came with another body; never sent again.
 *
 * Only an answer says whether a keyed write applied, so once retries are on it is sent again
 * until it is answered or `totalMs` runs out; `attempts` bounds every other call. A call sent
 * without a key (a caller's own `write` kind) goes again only when it certainly did not run:
 * its connection could not be opened, or Loom refused it with 429 before running it.
 * `Retry-After` is waited as asked unless it is longer than `maxWaitMs` (then the error is
 * thrown at once); otherwise the wait is an exponential backoff with jitter.
 */

import {
  LoomAPIError,
  LoomConnectionError,
  LoomError,
  LoomTimeout,
  LoomTransportError,
  errorFromAnswer,
} from "./errors.js";
import { OPS, WIDE_INTEGER_FIELDS, type CallOptions } from "./generated/ops.js";
import { parse, stringify } from "./json.js";
import { VERSION } from "./version.js";

export const DEFAULT_BASE_URL = "http://127.0.0.1:8000";
export const DEFAULT_TIMEOUT_MS = 10_000;
export const CLIENT_NAME = `loom-ts/${VERSION}`;

export interface RetryPolicy {
  /** Tries in all, the first included (1: never retry). Default 3. A keyed write, once
   * retries are on, is bounded by `totalMs` alone. */
  attempts?: number;
  /** The first backoff wait, doubled after each try up to `maxWaitMs`. Default 200. */
  backoffMs?: number;
  /** The longest wait; a longer Retry-After throws at once. Default 10 000. */
  maxWaitMs?: number;
  /** No new try starts this long after the first. Default 30 000. */
  totalMs?: number;
  /** How a wait is spent (tests pass their own clock). */
  sleep?: (ms: number) => Promise<void>;
  now?: () => number;
  random?: () => number;
}

export interface TransportOptions {
  baseUrl?: string | undefined;
  token?: string | undefined;
  timeoutMs?: number | undefined;
  retry?: RetryPolicy | false | undefined;
  fetch?: typeof fetch | undefined;
  clientName?: string | undefined;
}

export interface SendOptions extends CallOptions {
  /** The Idempotency-Key to send (a queued write keeps its own across replays). */
  idempotencyKey?: string;
}

const SAFE_KINDS = new Set(["read", "idempotent"]);
/** The retry kind of a call sent with an Idempotency-Key: applied once however often sent. */
export const KEYED = "keyed";
const IN_PROGRESS = "IDEMPOTENCY_IN_PROGRESS";
const MODEL_BUDGET_EXCEEDED = "MODEL_BUDGET_EXCEEDED";
// Errors of a connection that never opened: the request did not leave this machine.
const NEVER_CONNECTED = new Set(["ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH",
  "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT"]);
const PATH_PARAMETER = /<(?:[a-z_]+:)?(\w+)>|\{(\w+)\}/g;

function environment(name: string): string | undefined {
  const found = (globalThis as { process?: { env?: Record<string, string | undefined> } })
    .process?.env?.[name];
  return found === "" ? undefined : found;
}

function causeCode(error: unknown): string | undefined {
  for (let at: unknown = error; at; at = (at as { cause?: unknown }).cause) {
    const code = (at as { code?: unknown }).code;
    if (typeof code === "string") return code;
  }
  return undefined;
}

export function newIdempotencyKey(): string {
  return globalThis.crypto.randomUUID();
}

export class Transport {
  readonly baseUrl: string;
  readonly token: string | undefined;
  readonly timeoutMs: number;
  readonly clientName: string;
  private readonly retry: Required<RetryPolicy>;
  private readonly fetcher: typeof fetch;

  constructor(options: TransportOptions = {}) {
    this.baseUrl = (options.baseUrl ?? environment("LOOM_API_URL") ?? DEFAULT_BASE_URL)
      .replace(/\/+$/, "");
    this.token = options.token ?? environment("LOOM_API_KEY");
    this.timeoutMs = options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    if (!(this.timeoutMs > 0)) throw new RangeError("timeoutMs must be a positive number");
    this.clientName = options.clientName ?? CLIENT_NAME;
    const given = options.retry === false ? { attempts: 1 } : options.retry ?? {};
    this.retry = {
      attempts: given.attempts ?? 3,
      backoffMs: given.backoffMs ?? 200,
      maxWaitMs: given.maxWaitMs ?? 10_000,
      totalMs: given.totalMs ?? 30_000,
      sleep: given.sleep ?? ((ms) => new Promise((done) => setTimeout(done, ms))),
      now: given.now ?? (() => Date.now()),
      random: given.random ?? Math.random,
    };
    if (this.retry.attempts < 1) throw new RangeError("attempts counts the first try: 1 or more");
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** The op's kind: what is safe to send again. An op this SDK does not know is a write. */
  kindOf(op: string): string {
    return (OPS as Record<string, { kind: string }>)[op]?.kind ?? "write";
  }

  /** Send one op with its retries; answers the parsed answer object. */
  async send<A>(op: string, body: Record<string, unknown>, options: SendOptions = {}): Promise<A> {
    const kind = this.kindOf(op);
    const key = kind === "read" ? undefined : options.idempotencyKey ?? newIdempotencyKey();
    const retryKind = key === undefined ? kind : KEYED;
    const started = this.retry.now();
    for (let attempt = 1; ; attempt += 1) {
      try {
        return (await this.sendOnce(op, body, options, key)) as A;
      } catch (error) {
        const wait = error instanceof LoomError
          ? this.waitBeforeRetry(retryKind, error, attempt, this.retry.now() - started)
          : null;
        if (wait === null) throw error;
        await this.retry.sleep(wait);
      }
    }
  }

  /** Milliseconds to wait before try `attempt + 1`, or null when `error` is final. */
  waitBeforeRetry(kind: string, error: LoomError, attempt: number, elapsedMs: number): number | null {
    if (this.retry.attempts === 1 || !retriable(kind, error)) return null;
    // Past `attempts` a keyed write goes on only while its outcome may be settling on the
    // server: a connection that never opened holds no key and applied nothing.
    const neverSent = error instanceof LoomTransportError && !error.mayHaveReachedServer;
    if (attempt >= this.retry.attempts && (kind !== KEYED || neverSent)) return null;
    const asked = error instanceof LoomAPIError ? error.retryAfter : null;
    let wait: number;
    if (asked !== null) {
      wait = asked * 1000;
      if (wait > this.retry.maxWaitMs) return null;
    } else {
      const step = Math.min(this.retry.backoffMs * 2 ** (attempt - 1), this.retry.maxWaitMs);
      wait = step * (1 - this.retry.random() / 2);
    }
    return elapsedMs + wait > this.retry.totalMs ? null : wait;
  }

  private request(op: string, body: Record<string, unknown>): { url: string; method: string; payload: Record<string, unknown> } {
    const route = (OPS as Record<string, { method: string; path: string | null }>)[op];
    const payload = { ...body };
    let path = `/v1/${op}`;
    if (route?.path) {
      path = route.path.replace(PATH_PARAMETER, (_, angle?: string, brace?: string) => {
        const name = (angle ?? brace) as string;
        if (!(name in payload)) throw new TypeError(`${op} needs ${name} in its input`);
        const value = String(payload[name]);
        delete payload[name];
        return encodeURIComponent(value);
      });
    }
    const method = (route?.method ?? "POST").toUpperCase();
    let url = this.baseUrl + path;
    if (method === "GET") {
      const query = new URLSearchParams();
      for (const [name, value] of Object.entries(payload)) {
        if (value !== undefined && value !== null) query.append(name, String(value));
      }
      const text = query.toString();
      if (text) url += "?" + text;
    }
    return { url, method, payload };
  }

  private async sendOnce(op: string, body: Record<string, unknown>, options: SendOptions,
                         key: string | undefined): Promise<unknown> {
    const { url, method, payload } = this.request(op, body);
    const headers: Record<string, string> = {
      Accept: "application/json",
      "X-Loom-Client": this.clientName,
    };
    if (this.token) headers["Authorization"] = `Bearer ${this.token}`;
    if (key !== undefined) headers["Idempotency-Key"] = key;
    const init: RequestInit = { method, headers, redirect: "manual" };
    if (method !== "GET") {
      headers["Content-Type"] = "application/json";
      init.body = stringify(payload);
    }
    const timeoutMs = options.timeoutMs ?? this.timeoutMs;
    const timeout = AbortSignal.timeout(timeoutMs);
    init.signal = options.signal ? AbortSignal.any([options.signal, timeout]) : timeout;
    let response: Response;
    let text: string;
    try {
      response = await this.fetcher(url, init);
      text = await response.text();
    } catch (error) {
      if (options.signal?.aborted) throw error; // the caller's own abort is not a failure
      if (timeout.aborted) {
        throw new LoomTimeout(`${op}: no answer from ${this.baseUrl} in ${timeoutMs} ms`,
          { cause: error });
      }
      const code = causeCode(error);
      throw new LoomConnectionError(`${op}: cannot reach ${this.baseUrl} (${code ?? String(error)})`,
        { cause: error, mayHaveReachedServer: !(code !== undefined && NEVER_CONNECTED.has(code)) });
    }
    let data: unknown = null;
    try {
      data = text ? parse(text, WIDE_INTEGER_FIELDS) : null;
    } catch {
      data = null;
    }
    if (response.status >= 200 && response.status < 300) {
      if (typeof data !== "object" || data === null || Array.isArray(data)) {
        throw new LoomAPIError("the server's answer is not a JSON object",
          { status: response.status, code: "INVALID_ANSWER", response });
      }
      return data;
    }
    const error = typeof data === "object" && data !== null ? (data as { error?: unknown }).error : null;
    throw errorFromAnswer(response.status, error, response);
  }
}

/** Whether `error` may be met by sending the same call again (see the module comment). */
export function retriable(kind: string, error: LoomError): boolean {
  if (kind === KEYED) {
    if (error instanceof LoomTransportError) return true;
    if (error.code === MODEL_BUDGET_EXCEEDED) return false; // waiting seconds does not lift it
    return error.code === IN_PROGRESS || error.status === 429 || error.status === 503;
  }
  if (error instanceof LoomTransportError) return SAFE_KINDS.has(kind) || !error.mayHaveReachedServer;
  if (error.status === 429) return true; // refused before the op ran: nothing was written
  if (error.status === 503) return SAFE_KINDS.has(kind);
  return false;
}
