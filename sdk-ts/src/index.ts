/** `@loom/sdk`: Loom from TypeScript and JavaScript, on the platform's `fetch`. */

export { Agent, ContextPlane, DEFAULT_BLOCK_KEY, Profile, WorkingMemory } from "./agent.js";
export type { AgentOptions, Who } from "./agent.js";
export { AgentStateKeeper, AgentStateOf, DELETE, Scope, applyWrite } from "./agent_state.js";
export type {
  AgentState,
  AgentStateWritten,
  Mode,
  PutOptions,
  QueuedWrite,
  ReplayFailure,
  ScopeKind,
  StateBody,
  StateScope,
} from "./agent_state.js";
export * as errors from "./errors.js";
export * from "./errors.js";
export * from "./generated/ops.js";
export { parse, stringify } from "./json.js";
export type { Json } from "./json.js";
export { CLIENT_NAME, DEFAULT_BASE_URL, DEFAULT_TIMEOUT_MS, KEYED, Transport, retriable } from "./transport.js";
export type { RetryPolicy, SendOptions, TransportOptions } from "./transport.js";
export { VERSION } from "./version.js";
