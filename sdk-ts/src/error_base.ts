/**
 * The roots of the SDK's errors, which carry behaviour: the constructor, the transport's flag
 * and `retryAfter`. Every class below `LoomAPIError` (one per status, one per code) is
 * generated into `generated/errors.ts` from the server's error catalogue
 * (`app/error_catalogue.py`); these roots must match the Python SDK's (`sdk/loom/error_base.py`)
 * in names, parents and codes (`python -m app.sdk_ts --check`).
 *
 *     LoomError                      status, code, message, details, response
 *     ├── LoomTransportError         no answer arrived (status null)
 *     │   ├── LoomConnectionError    refused, reset, DNS, TLS
 *     │   └── LoomTimeout            no answer within the call's timeout
 *     └── LoomAPIError               Loom answered with an error (.retryAfter, .remedy)
 *         └── BadRequest 400 · Unauthorized 401 · Forbidden 403 · NotFound 404 ·
 *             MethodNotAllowed 405 · Conflict 409 · PreconditionFailed 412 ·
 *             PayloadTooLarge 413 · Unprocessable 422 · RateLimited 429 · ServerError 5xx,
 *             and under each the class of each code (generated)
 */

export interface ErrorOptions {
  status?: number | null;
  code?: string;
  details?: Record<string, unknown>;
  response?: Response;
  cause?: unknown;
}

export class LoomError extends Error {
  static readonly code: string = "LOOM_ERROR";
  readonly status: number | null;
  readonly code: string;
  readonly details: Record<string, unknown>;
  readonly response: Response | undefined;

  constructor(message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.status = options.status ?? null;
    this.code = options.code ?? (new.target as unknown as { code: string }).code;
    this.details = { ...(options.details ?? {}) };
    this.response = options.response;
  }

  override toString(): string {
    const where = this.status === null ? "" : ` (HTTP ${this.status})`;
    return `${this.code}${where}: ${this.message}`;
  }
}

/** No answer arrived. `mayHaveReachedServer` is false only when the connection could not be
 * opened: only then is a write certainly not applied. */
export class LoomTransportError extends LoomError {
  static override readonly code: string = "TRANSPORT_ERROR";
  readonly mayHaveReachedServer: boolean;

  constructor(message: string, options: ErrorOptions & { mayHaveReachedServer?: boolean } = {}) {
    super(message, options);
    this.mayHaveReachedServer = options.mayHaveReachedServer ?? true;
  }
}

export class LoomConnectionError extends LoomTransportError {
  static override readonly code: string = "CONNECTION_ERROR";
}

export class LoomTimeout extends LoomTransportError {
  static override readonly code: string = "TIMEOUT";
}

export class LoomAPIError extends LoomError {
  static override readonly code: string = "HTTP_ERROR";

  /** What the catalogue says a caller should do about the code (`fix_input`, `retry_after`,
   * `retry_with_backoff`, `read_then_resend`, `authenticate`, `do_not_retry`); null for a
   * class that stands for a whole status. */
  get remedy(): string | null {
    return (this.constructor as { remedy?: string | null }).remedy ?? null;
  }

  /** Seconds to wait before asking again: the error's `retry_after`, else Retry-After. */
  get retryAfter(): number | null {
    let value: unknown = this.details["retry_after"];
    if (value === undefined || value === null) value = this.response?.headers.get("Retry-After");
    if (value === undefined || value === null || value === "") return null;
    const seconds = Number(value);
    return Number.isFinite(seconds) ? Math.max(seconds, 0) : null; // an HTTP date: none
  }
}

export type ErrorClass = (new (message: string, options?: ErrorOptions) => LoomAPIError) & {
  readonly code: string;
};
