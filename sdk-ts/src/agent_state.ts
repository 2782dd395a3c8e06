/**
 * Agent state from the SDK (seed 002, "Reading"): scopes, read-your-writes, offline writes.
 *
 *     const convo = bot.conversation("c-1");
 *     const state = await convo.agentState.get();          // version 0n and {} at first
 *     const written = await convo.agentState.put({ step: "sizes" }); // merge_by_key
 *     await convo.agentState.put({ step: "checkout" }, { mode: "cas", ifVersion: state.version });
 *     await convo.agentState.put({ offer: DELETE });        // remove one field
 *
 * What the Agent keeps, per scope and agent, in memory (`bot.agentState`):
 * - the last version (and body) it wrote or read; a read answering an older version is served
 *   from what the SDK knows, so after `stored` at N every later `get` answers N or newer;
 * - with Loom out of reach (no answer: refused, reset, timeout), a write is queued and
 *   answered `stored: false, reason: "pending"`. The queue is sent again, in order, each
 *   write with its own `ifVersion` and Idempotency-Key, before the next `put` or `get` or on
 *   `flush()`. A replayed compare-and-swap Loom refuses with 412 lands in `conflicts` (never
 *   merged in silence); any other refusal in `rejected`. A `get` while Loom is out of reach
 *   serves the last known state with the scope's queued writes applied (`offline: true`).
 * Calls of one Agent's agent state run one at a time, in the order they were made.
 */

import { AgentStateConflict, LoomAPIError, LoomTransportError, RateLimited, ServerError } from "./errors.js";
import type { AgentStatePutAnswer, AgentStateReadAnswer, CallOptions } from "./generated/ops.js";
import { newIdempotencyKey, type SendOptions } from "./transport.js";

/** Written as a field's value in a merge: removes that field and keeps the others. */
export const DELETE: { readonly $delete: true } = Object.freeze({ $delete: true as const });

export type Mode = "merge_by_key" | "cas";
export type ScopeKind = "conversation" | "task" | "object" | "subject";
export type StateBody = Record<string, unknown>;

export interface StateScope {
  readonly kind: ScopeKind;
  readonly id: string;
}

/** A read. `offline`: Loom was out of reach, this is what the SDK knows with the queued
 * writes applied. `pending`: writes of this scope still queued. `stale`: Loom answered older
 * than a version this SDK wrote without knowing its body; this is Loom's answer. */
export interface AgentState {
  body: StateBody;
  version: bigint;
  updatedAt: string | null;
  offline: boolean;
  pending: number;
  stale: boolean;
}

/** A write: `reason` is null when stored, else over_cap, not_declared_field, conflict (412)
 * or pending (queued while Loom is out of reach; `version` is then the last one known). */
export interface AgentStateWritten {
  stored: boolean;
  version: bigint;
  reason: string | null;
  pending: boolean;
}

export interface PutOptions extends CallOptions {
  mode?: Mode;
  /** Apply only at this version (0 when the state must not exist yet). Required with cas. */
  ifVersion?: bigint | number;
  /** A handle of the customer the state is about, when the scope does not name them. */
  subject?: string;
}

export interface QueuedWrite {
  readonly scope: StateScope;
  readonly mode: Mode;
  readonly body: StateBody;
  readonly ifVersion: bigint | null;
  readonly subject: string | null;
  readonly queuedAt: Date;
  readonly idempotencyKey: string;
  readonly key: string;
}

/** A queued write Loom refused when it was sent again: `error` is the thrown error (an
 * AgentStateConflict in `conflicts`, whose `details.version` is the version Loom holds), or
 * null when Loom answered `stored: false` with `reason`. */
export interface ReplayFailure {
  readonly write: QueuedWrite;
  readonly error: LoomAPIError | null;
  readonly reason: string | null;
}

interface Known {
  version: bigint;
  body: StateBody | null; // null: a version this SDK wrote without knowing its body
  updatedAt: string | null;
}

export type SendOp = <A>(op: string, input: Record<string, unknown>, options?: SendOptions) => Promise<A>;

const copy = <T>(value: T): T => structuredClone(value);

function isDelete(value: unknown): boolean {
  return typeof value === "object" && value !== null && !Array.isArray(value) &&
    Object.keys(value).length === 1 && (value as { $delete?: unknown }).$delete === true;
}

/** The state after a write, by the seed's rules: cas replaces the whole body; merge_by_key
 * replaces each named field whole and removes one written as DELETE. */
export function applyWrite(body: StateBody, mode: Mode, written: StateBody): StateBody {
  if (mode === "cas") return copy(written);
  const merged = copy(body);
  for (const [name, value] of Object.entries(written)) {
    if (isDelete(value)) delete merged[name];
    else merged[name] = copy(value);
  }
  return merged;
}

function asBigint(value: unknown): bigint {
  if (typeof value === "bigint") return value;
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  return 0n;
}

/** `bot.agentState`: the Agent's record of agent state (see the module comment). */
export class AgentStateKeeper {
  readonly conflicts: ReplayFailure[] = [];
  readonly rejected: ReplayFailure[] = [];
  private readonly known = new Map<string, Known>();
  private readonly queue: QueuedWrite[] = [];
  private turn: Promise<unknown> = Promise.resolve();

  constructor(private readonly send: SendOp, private readonly identity: Readonly<Record<string, string>>) {}

  /** The name of one kept state: the Agent's identity and the scope. */
  key(scope: StateScope): string {
    const who = this.identity;
    return JSON.stringify([who["org"] ?? "", who["namespace"] ?? "", who["agent"] ?? "", scope.kind, scope.id]);
  }

  /** The writes waiting for Loom, oldest first. */
  get pending(): readonly QueuedWrite[] {
    return [...this.queue];
  }

  /** One call at a time, in order: the queue keeps its order across concurrent callers. */
  private serialised<T>(work: () => Promise<T>): Promise<T> {
    const run = this.turn.then(work, work);
    this.turn = run.catch(() => undefined);
    return run;
  }

  get(scope: StateScope, options: CallOptions = {}): Promise<AgentState> {
    return this.serialised(async () => {
      const key = this.key(scope);
      if (this.queue.length) await this.drain(options);
      if (this.queue.some((write) => write.key === key)) return this.offlineState(key);
      let answer: AgentStateReadAnswer;
      try {
        answer = await this.send<AgentStateReadAnswer>("agent_state.read", { scope: { ...scope } }, options);
      } catch (error) {
        if (error instanceof LoomTransportError) return this.offlineState(key);
        throw error;
      }
      return this.reconcile(key, answer);
    });
  }

  put(scope: StateScope, body: StateBody, options: PutOptions = {}): Promise<AgentStateWritten> {
    const mode = options.mode ?? "merge_by_key";
    if (mode !== "merge_by_key" && mode !== "cas") {
      return Promise.reject(new TypeError(`mode must be merge_by_key or cas, not ${String(mode)}`));
    }
    if (typeof body !== "object" || body === null || Array.isArray(body)) {
      return Promise.reject(new TypeError("body must be an object"));
    }
    const write: QueuedWrite = {
      scope: { ...scope }, mode, body: copy(body),
      ifVersion: options.ifVersion === undefined ? null : BigInt(options.ifVersion),
      subject: options.subject ?? null, queuedAt: new Date(),
      idempotencyKey: newIdempotencyKey(), key: this.key(scope),
    };
    return this.serialised(async () => {
      if (this.queue.length) await this.drain(options);
      // Loom is still out of reach: this write waits behind the others, in order.
      if (this.queue.length) return this.enqueue(write);
      let answer: AgentStatePutAnswer;
      try {
        answer = await this.send<AgentStatePutAnswer>("agent_state.put", this.payload(write),
          { ...options, idempotencyKey: write.idempotencyKey });
      } catch (error) {
        if (error instanceof LoomTransportError) return this.enqueue(write);
        if (error instanceof AgentStateConflict) {
          return { stored: false, version: heldVersion(error, write), reason: "conflict", pending: false };
        }
        throw error;
      }
      return this.written(write, answer);
    });
  }

  /** Send the queued writes again, in order; answers how many still wait. */
  flush(options: CallOptions = {}): Promise<number> {
    return this.serialised(async () => {
      await this.drain(options);
      return this.queue.length;
    });
  }

  /** What the SDK knows of a scope's state, without a call (null when nothing). */
  knownState(scope: StateScope): AgentState | null {
    const found = this.known.get(this.key(scope));
    if (!found || found.body === null) return null;
    return { body: copy(found.body), version: found.version, updatedAt: found.updatedAt,
      offline: false, pending: 0, stale: false };
  }

  private payload(write: QueuedWrite): Record<string, unknown> {
    const payload: Record<string, unknown> = { scope: { ...write.scope }, mode: write.mode, body: write.body };
    if (write.ifVersion !== null) payload["if_version"] = write.ifVersion;
    if (write.subject !== null) payload["subject"] = write.subject;
    return payload;
  }

  private async drain(options: CallOptions): Promise<void> {
    while (this.queue.length) {
      const write = this.queue[0] as QueuedWrite;
      try {
        const answer = await this.send<AgentStatePutAnswer>("agent_state.put", this.payload(write),
          { ...options, idempotencyKey: write.idempotencyKey });
        const result = this.written(write, answer);
        if (!result.stored) this.rejected.push({ write, error: null, reason: result.reason });
      } catch (error) {
        if (error instanceof LoomTransportError || error instanceof RateLimited ||
            error instanceof ServerError) {
          return; // still out of reach (or busy): the rest waits, in order
        }
        if (error instanceof AgentStateConflict) {
          this.conflicts.push({ write, error, reason: "conflict" });
        } else if (error instanceof LoomAPIError) {
          this.rejected.push({ write, error, reason: error.code });
        } else {
          throw error;
        }
      }
      this.queue.shift();
    }
  }

  private enqueue(write: QueuedWrite): AgentStateWritten {
    this.queue.push(write);
    const known = this.known.get(write.key);
    return { stored: false, version: known ? known.version : 0n, reason: "pending", pending: true };
  }

  private written(write: QueuedWrite, answer: AgentStatePutAnswer): AgentStateWritten {
    const stored = answer.stored === true;
    const version = asBigint(answer.version);
    if (stored) {
      const known = this.known.get(write.key);
      let body: StateBody | null;
      if (write.mode === "cas") body = copy(write.body);
      else if (version === 1n) body = applyWrite({}, "merge_by_key", write.body); // versions start at 1
      else if (known && known.body !== null && known.version === version - 1n) {
        body = applyWrite(known.body, "merge_by_key", write.body);
      } else body = null; // a merge over a state this SDK did not hold
      if (!known || version >= known.version) {
        this.known.set(write.key, { version, body, updatedAt: new Date().toISOString() });
      }
    }
    const reason = typeof answer.reason === "string" ? answer.reason : null;
    return { stored, version, reason, pending: false };
  }

  private reconcile(key: string, answer: AgentStateReadAnswer): AgentState {
    const version = asBigint(answer.version);
    const body: StateBody = { ...(answer.body ?? {}) };
    const updatedAt = typeof answer.updated_at === "string" ? answer.updated_at : null;
    const known = this.known.get(key);
    if (!known || version >= known.version) {
      this.known.set(key, { version, body: copy(body), updatedAt });
      return { body, version, updatedAt, offline: false, pending: 0, stale: false };
    }
    // Loom answered older than this SDK wrote or read: serve what the SDK knows.
    if (known.body !== null) {
      return { body: copy(known.body), version: known.version, updatedAt: known.updatedAt,
        offline: false, pending: 0, stale: false };
    }
    return { body, version, updatedAt, offline: false, pending: 0, stale: true };
  }

  private offlineState(key: string): AgentState {
    const known = this.known.get(key);
    let body: StateBody = known && known.body !== null ? copy(known.body) : {};
    const queued = this.queue.filter((write) => write.key === key);
    for (const write of queued) body = applyWrite(body, write.mode, write.body);
    return { body, version: known ? known.version : 0n, updatedAt: known ? known.updatedAt : null,
      offline: true, pending: queued.length, stale: false };
  }
}

function heldVersion(error: AgentStateConflict, write: QueuedWrite): bigint {
  const held = error.details["version"];
  return typeof held === "bigint" || typeof held === "number" ? asBigint(held) : write.ifVersion ?? 0n;
}

/** `scope.agentState`: get, put and flush for one scope, and its conflicts. */
export class AgentStateOf {
  constructor(private readonly keeper: AgentStateKeeper, readonly scope: StateScope) {}

  /** The state: body, version, updatedAt (version 0n and an empty body before the first write). */
  get(options?: CallOptions): Promise<AgentState> {
    return this.keeper.get(this.scope, options);
  }

  /** Write by merge_by_key (the default) or cas (with ifVersion; 0 for a new state). */
  put(body: StateBody, options?: PutOptions): Promise<AgentStateWritten> {
    return this.keeper.put(this.scope, body, options);
  }

  /** Send every queued write again (all scopes, in order); answers how many still wait. */
  flush(options?: CallOptions): Promise<number> {
    return this.keeper.flush(options);
  }

  /** Replayed writes of this scope that Loom refused with 412, oldest first. */
  get conflicts(): ReplayFailure[] {
    const key = this.keeper.key(this.scope);
    return this.keeper.conflicts.filter((failure) => failure.write.key === key);
  }

  /** Replayed writes of this scope that Loom did not store for another reason. */
  get rejected(): ReplayFailure[] {
    const key = this.keeper.key(this.scope);
    return this.keeper.rejected.filter((failure) => failure.write.key === key);
  }

  /** This scope's writes waiting for Loom, oldest first. */
  get pending(): QueuedWrite[] {
    const key = this.keeper.key(this.scope);
    return this.keeper.pending.filter((write) => write.key === key);
  }
}

/** What a state belongs to: `bot.conversation(id)` and its kin. */
export class Scope {
  readonly agentState: AgentStateOf;

  constructor(keeper: AgentStateKeeper, readonly kind: ScopeKind, readonly id: string) {
    if (typeof id !== "string" || !id) throw new TypeError(`a ${kind} scope needs a non-empty string id`);
    this.agentState = new AgentStateOf(keeper, { kind, id });
  }

  // The id stays out of what is printed: a conversation id can be a phone number.
  toString(): string {
    return `<loom ${this.kind} scope>`;
  }

  toJSON(): { kind: ScopeKind } {
    return { kind: this.kind };
  }
}
