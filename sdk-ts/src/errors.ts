/** Every error the SDK throws, and `errorFromAnswer`, which picks the class of an answer. */

import { LoomAPIError, type ErrorClass } from "./error_base.js";
import { BY_CODE, BY_STATUS, ServerError } from "./generated/errors.js";

export * from "./error_base.js";
export * from "./generated/errors.js";

/** The class for an error answer: by code, else by status, else the root of answers, so
 * `instanceof NotFound` keeps working when the server grows a new 404 code. */
export function errorClass(status: number, code: string | null | undefined): ErrorClass {
  if (code && Object.hasOwn(BY_CODE, code)) return BY_CODE[code] as ErrorClass;
  const byStatus = BY_STATUS[status];
  if (byStatus) return byStatus;
  return status >= 500 ? ServerError : LoomAPIError;
}

/** The error for a non-2xx answer (`error` is the answer's `"error"` object, if any). */
export function errorFromAnswer(status: number, error: unknown, response?: Response): LoomAPIError {
  const fields: Record<string, unknown> =
    typeof error === "object" && error !== null ? { ...(error as Record<string, unknown>) } : {};
  const code = typeof fields["code"] === "string" ? (fields["code"] as string) : null;
  const message = typeof fields["message"] === "string" ? (fields["message"] as string) : `HTTP ${status}`;
  delete fields["code"];
  delete fields["message"];
  const Class = errorClass(status, code);
  // An answer without Loom's error shape (a proxy's page) keeps its status as its code.
  return new Class(message, { status, code: code ?? `HTTP_${status}`, details: fields, response });
}
