/**
 * The SDK's error hierarchy above the per-code classes (those are generated from the server's
 * error table into `generated/errors.ts`).
 *
 *     LoomError                      status, code, message, details, response
 *     ├── LoomTransportError         no answer arrived (status null)
 *     │   ├── LoomConnectionError    refused, reset, DNS, TLS
 *     │   └── LoomTimeout            no answer within the call's timeout
 *     └── LoomAPIError               Loom answered with an error
 *         ├── BadRequest 400 · Unauthorized 401 · Forbidden 403 · NotFound 404
 *         ├── MethodNotAllowed 405 · Conflict 409 · PreconditionFailed 412
 *         ├── PayloadTooLarge 413 · Unprocessable 422 (.fields) ─ LimitExceeded
 *         ├── TooManyRequests 429 (.retryAfter)
 *         └── ServerError 5xx (.retryAfter)
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

  /** Seconds to wait before asking again: the error's `retry_after`, else Retry-After. */
  get retryAfter(): number | null {
    let value: unknown = this.details["retry_after"];
    if (value === undefined || value === null) value = this.response?.headers.get("Retry-After");
    if (value === undefined || value === null || value === "") return null;
    const seconds = Number(value);
    return Number.isFinite(seconds) ? Math.max(seconds, 0) : null; // an HTTP date: none
  }
}

export class BadRequest extends LoomAPIError {
  static override readonly code: string = "BAD_REQUEST";
}
export class Unauthorized extends LoomAPIError {
  static override readonly code: string = "AUTH_REQUIRED";
}
export class Forbidden extends LoomAPIError {
  static override readonly code: string = "FORBIDDEN";
}
export class NotFound extends LoomAPIError {
  static override readonly code: string = "NOT_FOUND";
}
export class MethodNotAllowed extends LoomAPIError {
  static override readonly code: string = "METHOD_NOT_ALLOWED";
}
export class Conflict extends LoomAPIError {
  static override readonly code: string = "CONFLICT";
}
export class PreconditionFailed extends LoomAPIError {
  static override readonly code: string = "PRECONDITION_FAILED";
}
export class PayloadTooLarge extends LoomAPIError {
  static override readonly code: string = "PAYLOAD_TOO_LARGE";
}
export class Unprocessable extends LoomAPIError {
  static override readonly code: string = "UNPROCESSABLE";

  /** For VALIDATION_ERROR: each bad field with its messages. */
  get fields(): Record<string, unknown> {
    const found = this.details["fields"];
    return typeof found === "object" && found !== null ? { ...(found as object) } : {};
  }
}
/** A write over a size cap; nothing was written. */
export class LimitExceeded extends Unprocessable {
  static override readonly code: string = "LIMIT_EXCEEDED";

  get valueLength(): number | null {
    const found = this.details["value_length"];
    return typeof found === "number" ? found : null;
  }

  get charLimit(): number | null {
    const found = this.details["char_limit"];
    return typeof found === "number" ? found : null;
  }
}
export class TooManyRequests extends LoomAPIError {
  static override readonly code: string = "TOO_MANY_REQUESTS";
}
export class ServerError extends LoomAPIError {
  static override readonly code: string = "INTERNAL_ERROR";
}

export type ErrorClass = (new (message: string, options?: ErrorOptions) => LoomAPIError) & {
  readonly code: string;
};

/** The class for a status whose code this SDK does not know. */
export const BY_STATUS: Readonly<Record<number, ErrorClass>> = {
  400: BadRequest,
  401: Unauthorized,
  403: Forbidden,
  404: NotFound,
  405: MethodNotAllowed,
  409: Conflict,
  412: PreconditionFailed,
  413: PayloadTooLarge,
  422: Unprocessable,
  429: TooManyRequests,
};
