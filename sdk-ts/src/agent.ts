/**
 * `Agent`: one identity (org, namespace, agent) talking to one Loom server.
 *
 *     const bot = new Agent({ org: "acme", namespace: "support", agent: "triage-bot" });
 *     await bot.workingMemory.set("cursor: ticket 4812", "state", { runId: "run-7" });
 *     const convo = bot.conversation("c-1");
 *     const state = await convo.agentState.get();
 *
 * `org`, `namespace` and `agent` are sent under every body (an input that names one wins);
 * left out, a token that fixes them fills them in. `baseUrl` defaults to `LOOM_API_URL`
 * (else http://127.0.0.1:8000) and `token` to `LOOM_API_KEY` where the runtime has an
 * environment. Every call has a timeout (`timeoutMs`, 10 s by default, and per call).
 */

import { AgentStateKeeper, Scope } from "./agent_state.js";
import {
  OpsClient,
  type CallOptions,
  type ContextPackAnswer,
  type ContextPackInput,
  type MemoryDeleteAnswer,
  type MemoryGetAnswer,
  type MemoryListAnswer,
  type MemoryListInput,
  type ProfileActivityAnswer,
  type ProfileAppendAnswer,
  type ProfileRenderAnswer,
  type ProfileReplaceAnswer,
  type ProfileSetAnswer,
  type ProfileStructuredAnswer,
  type WorkingMemoryAppendAnswer,
  type WorkingMemoryDeleteAnswer,
  type WorkingMemoryGetAnswer,
  type WorkingMemoryRenderAnswer,
  type WorkingMemoryReplaceAnswer,
  type WorkingMemorySetAnswer,
} from "./generated/ops.js";
import { Transport, type RetryPolicy, type SendOptions } from "./transport.js";

export interface AgentOptions {
  org?: string;
  namespace?: string;
  agent?: string;
  baseUrl?: string;
  /** Sent as `Authorization: Bearer <token>`. */
  token?: string;
  timeoutMs?: number;
  /** The retry policy; `false` for none. */
  retry?: RetryPolicy | false;
  /** The fetch to send with (the platform's by default). */
  fetch?: typeof fetch;
  clientName?: string;
}

/** Who a working-memory or profile call is about. */
export interface Who extends CallOptions {
  userId?: string;
  sessionId?: string;
  runId?: string;
}

export const DEFAULT_BLOCK_KEY = "scratchpad";

type Sender = <A>(op: string, input: Record<string, unknown>, options?: SendOptions) => Promise<A>;

function present(fields: Record<string, unknown>): Record<string, unknown> {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined && value !== null));
}

function who(options: Who): Record<string, unknown> {
  return { user_id: options.userId, session_id: options.sessionId, run_id: options.runId };
}

/** `bot.workingMemory`: small named blocks the agent is told every time (seed 004). */
export class WorkingMemory {
  constructor(private readonly send: Sender) {}

  /** Replace a block's content; over `charLimit` throws WorkingMemoryLimitExceeded. */
  set(content: string, blockKey = DEFAULT_BLOCK_KEY, options: Who & { charLimit?: number } = {}): Promise<WorkingMemorySetAnswer> {
    return this.send("working_memory.set", present({ content, block_key: blockKey, char_limit: options.charLimit, ...who(options) }), options);
  }

  /** Append `addition` after `separator`; a missing block is created. */
  append(addition: string, blockKey = DEFAULT_BLOCK_KEY, options: Who & { separator?: string } = {}): Promise<WorkingMemoryAppendAnswer> {
    return this.send("working_memory.append", present({ addition, block_key: blockKey, separator: options.separator, ...who(options) }), options);
  }

  /** Replace every `old` with `new` in a block (SubstringNotFound when absent). */
  replace(old: string, replacement = "", options: Who & { blockKey?: string } = {}): Promise<WorkingMemoryReplaceAnswer> {
    return this.send("working_memory.replace", present({ old, new: replacement, block_key: options.blockKey ?? DEFAULT_BLOCK_KEY, ...who(options) }), options);
  }

  /** Delete a block; `deleted` is false when there was none. */
  delete(blockKey = DEFAULT_BLOCK_KEY, options: Who = {}): Promise<WorkingMemoryDeleteAnswer> {
    return this.send("working_memory.delete", present({ block_key: blockKey, ...who(options) }), options);
  }

  /** Read one block; `found` is false when it is missing. */
  get(blockKey = DEFAULT_BLOCK_KEY, options: Who = {}): Promise<WorkingMemoryGetAnswer> {
    return this.send("working_memory.get", present({ block_key: blockKey, ...who(options) }), options);
  }

  /** The blocks in scope as one XML or Markdown text (`rendered`). */
  render(options: Who & { format?: "xml" | "markdown"; blockKeys?: string[]; limit?: number } = {}): Promise<WorkingMemoryRenderAnswer> {
    return this.send("working_memory.render", present({ format: options.format, block_keys: options.blockKeys, limit: options.limit, ...who(options) }), options);
  }
}

type ProfileRead = Who & { readScope?: string };

/** `bot.profile`: always-loaded sections about the user or the agent (seeds 000, 003).
 * `get`, `list` and `delete` go through memory.get / memory.list / memory.delete with
 * `memory_type: "profile"` and the label as the key. */
export class Profile {
  constructor(private readonly send: Sender) {}

  /** Create or replace the section at `label` (HashMismatch on a stale ifMatchSha256). */
  set(label: string, value: string, options: Who & { charLimit?: number; ifMatchSha256?: string; sourceTrace?: string } = {}): Promise<ProfileSetAnswer> {
    return this.send("profile.set", present({ label, value, char_limit: options.charLimit, if_match_sha256: options.ifMatchSha256, source_trace: options.sourceTrace, ...who(options) }), options);
  }

  /** Append to a section; a missing section is created. */
  append(label: string, addition: string, options: Who & { separator?: string } = {}): Promise<ProfileAppendAnswer> {
    return this.send("profile.append", present({ label, addition, separator: options.separator, ...who(options) }), options);
  }

  /** Rewrite `old` to `replacement` inside a section (SubstringNotFound when absent). */
  replace(label: string, old: string, replacement: string, options: Who = {}): Promise<ProfileReplaceAnswer> {
    return this.send("profile.replace", present({ label, old, new: replacement, ...who(options) }), options);
  }

  /** Every section (or `labels`, in that order) as one prompt fragment (`rendered`). */
  render(options: ProfileRead & { labels?: string[]; format?: "xml" | "markdown"; scope?: string } = {}): Promise<ProfileRenderAnswer> {
    return this.send("profile.render", present({ read_scope: options.readScope, labels: options.labels, format: options.format, scope: options.scope, ...who(options) }), options);
  }

  /** Which clients read the profile, and when. */
  activity(lookbackDays = 7, options: Who = {}): Promise<ProfileActivityAnswer> {
    return this.send("profile.activity", present({ lookback_days: lookbackDays, ...who(options) }), options);
  }

  /** One user's structured profile with its `status`; never calls a model. */
  structured(options: ProfileRead = {}): Promise<ProfileStructuredAnswer> {
    return this.send("profile.structured", present({ read_scope: options.readScope, ...who(options) }), options);
  }

  /** One section: memory.get with the label as the key. */
  get(label: string, options: ProfileRead = {}): Promise<MemoryGetAnswer> {
    return this.send("memory.get", present({ memory_type: "profile", key: label, read_scope: options.readScope, ...who(options) }), options);
  }

  /** Every section: memory.list of profile rows (other fields pass through). */
  list(options: Who & Omit<MemoryListInput, "memory_type" | "user_id" | "session_id" | "run_id"> = {}): Promise<MemoryListAnswer> {
    const { userId, sessionId, runId, timeoutMs, signal, ...fields } = options;
    return this.send("memory.list", present({ ...fields, memory_type: "profile", ...who({ userId, sessionId, runId }) }), { timeoutMs, signal } as CallOptions);
  }

  /** Delete a section: memory.delete with the label as the key. */
  delete(label: string, options: Who = {}): Promise<MemoryDeleteAnswer> {
    return this.send("memory.delete", present({ memory_type: "profile", key: label, ...who(options) }), options);
  }
}

/** `bot.context`: context packs. */
export class ContextPlane {
  constructor(private readonly send: Sender) {}

  /** What an agent is told every time, as one text (`pack`), with its stable prefix. */
  pack(input: ContextPackInput = {}, options: CallOptions = {}): Promise<ContextPackAnswer> {
    return this.send("context.pack", present({ ...input }), options);
  }
}

export class Agent {
  readonly identity: Readonly<Record<string, string>>;
  readonly transport: Transport;
  /** Every op of the registry, typed: `bot.client.memory.set({ key, value })`. */
  readonly client: OpsClient;
  readonly workingMemory: WorkingMemory;
  readonly profile: Profile;
  readonly context: ContextPlane;
  /** What the SDK keeps of agent state: known versions, queued writes, conflicts. */
  readonly agentState: AgentStateKeeper;

  constructor(options: AgentOptions = {}) {
    const identity: Record<string, string> = {};
    for (const name of ["org", "namespace", "agent"] as const) {
      const value = options[name];
      if (value !== undefined) identity[name] = value;
    }
    this.identity = Object.freeze(identity);
    this.transport = new Transport(options);
    const send: Sender = (op, input, callOptions) =>
      this.transport.send(op, { ...this.identity, ...present(input) }, callOptions);
    this.client = new OpsClient((op, input, callOptions) => send(op, input as Record<string, unknown>, callOptions));
    this.workingMemory = new WorkingMemory(send);
    this.profile = new Profile(send);
    this.context = new ContextPlane(send);
    this.agentState = new AgentStateKeeper(send, this.identity);
  }

  /** A conversation's scope. */
  conversation(conversationId: string): Scope {
    return new Scope(this.agentState, "conversation", conversationId);
  }

  task(taskId: string): Scope {
    return new Scope(this.agentState, "task", taskId);
  }

  /** An object's scope; its id travels as "<type>:<id>". */
  object(objectType: string, objectId: string): Scope {
    return new Scope(this.agentState, "object", `${objectType}:${objectId}`);
  }

  /** A customer's scope, by one of their handles (email, phone, customer id). */
  subject(handle: string): Scope {
    return new Scope(this.agentState, "subject", handle);
  }

  /** Send agent-state writes queued while Loom was out of reach; answers how many wait. */
  flush(options?: CallOptions): Promise<number> {
    return this.agentState.flush(options);
  }

  toString(): string {
    const who = ["org", "namespace", "agent"].map((name) => this.identity[name] ?? "?").join("/");
    return `<loom Agent ${who} at ${this.transport.baseUrl}>`;
  }
}
