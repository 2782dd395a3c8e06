// Agent state against the live server: cas, read-your-writes, the offline queue and conflicts.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Agent, DELETE } from "@loom/sdk";
import { AGENT_TYPE, freshNamespace, relay, servers } from "./support.mjs";

async function space() {
  const { open } = servers();
  const namespace = freshNamespace("state");
  const admin = new Agent({ namespace, baseUrl: open });
  await admin.client.features.set({ features: { agent_state: true } });
  await admin.client.objectTypes.set({ types: [AGENT_TYPE] });
  return { open, namespace };
}

/** A fetch that records the headers and bodies of agent-state writes, then sends them. */
function recordingFetch() {
  const writes = [];
  const send = async (url, init) => {
    if (init?.method === "PUT") writes.push({ key: init.headers["Idempotency-Key"], body: JSON.parse(init.body) });
    return fetch(url, init);
  };
  return { writes, fetch: send };
}

test("put and get: merge_by_key, DELETE, cas at the version, 412 answered as conflict", async () => {
  const { open, namespace } = await space();
  const bot = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: open });
  const convo = bot.conversation("c-2");
  const first = await convo.agentState.get();
  assert.deepEqual(first.body, {});
  assert.equal(first.version, 0n);
  const written = await convo.agentState.put({ step: "sizes", offer: "familia-plus" });
  assert.deepEqual(written, { stored: true, version: 1n, reason: null, pending: false });
  const removed = await convo.agentState.put({ offer: DELETE });
  assert.equal(removed.version, 2n);
  const lost = await convo.agentState.put({ step: "checkout" }, { mode: "cas", ifVersion: 1n });
  assert.deepEqual(lost, { stored: false, version: 2n, reason: "conflict", pending: false });
  const won = await convo.agentState.put({ step: "checkout" }, { mode: "cas", ifVersion: removed.version });
  assert.equal(won.stored, true);
  const state = await convo.agentState.get();
  assert.deepEqual(state.body, { step: "checkout" });
  assert.equal(state.version, 3n);
  const undeclared = await convo.agentState.put({ colour: "red" });
  assert.deepEqual(undeclared, { stored: false, version: 3n, reason: "not_declared_field", pending: false });
});

test("concurrent merges of different fields from one Agent keep both and run in order", async () => {
  const { open, namespace } = await space();
  const bot = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: open });
  const convo = bot.conversation("c-3");
  const results = await Promise.all([
    convo.agentState.put({ step: "sizes" }),
    convo.agentState.put({ offer: "o-1" }),
    convo.agentState.put({ cart_note: "two shirts" }),
  ]);
  assert.deepEqual(results.map((result) => result.version), [1n, 2n, 3n]);
  const state = await convo.agentState.get();
  assert.deepEqual(Object.keys(state.body).sort(), ["cart_note", "offer", "step"]);
});

test("Loom out of reach: writes queue, a get serves them, the replay keeps ifVersion and Idempotency-Key", async () => {
  const { open, namespace } = await space();
  const link = await relay(open);
  const recorder = recordingFetch();
  const bot = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: link.url,
    fetch: recorder.fetch, retry: false, timeoutMs: 5000 });
  const convo = bot.conversation("c-4");
  const stored = await convo.agentState.put({ step: "sizes" });
  assert.equal(stored.version, 1n);

  await link.down();
  const queued = await convo.agentState.put({ step: "offer" }, { mode: "cas", ifVersion: 1n });
  assert.deepEqual(queued, { stored: false, version: 1n, reason: "pending", pending: true });
  const behind = await convo.agentState.put({ offer: "o-9" });
  assert.equal(behind.reason, "pending");
  assert.equal(convo.agentState.pending.length, 2);
  const offline = await convo.agentState.get();
  assert.equal(offline.offline, true);
  assert.equal(offline.pending, 2);
  assert.deepEqual(offline.body, { step: "offer", offer: "o-9" });
  assert.equal(await bot.flush(), 2); // still out of reach: nothing lost, nothing sent twice

  await link.up();
  assert.equal(await bot.flush(), 0);
  const tries = recorder.writes.filter((write) => write.body.mode === "cas");
  assert.ok(tries.length >= 2, "the cas was tried while down and again after");
  assert.deepEqual(new Set(tries.map((write) => write.body.if_version)), new Set([1]));
  assert.equal(new Set(tries.map((write) => write.key)).size, 1, "one Idempotency-Key for one write");
  const state = await convo.agentState.get();
  assert.deepEqual(state.body, { step: "offer", offer: "o-9" });
  assert.equal(state.version, 3n);
  assert.deepEqual(convo.agentState.conflicts, []);
  await link.down();
});

test("a queued cas that conflicts on replay is reported in conflicts, never merged", async () => {
  const { open, namespace } = await space();
  const link = await relay(open);
  const bot = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: link.url, retry: false });
  const convo = bot.conversation("c-5");
  await convo.agentState.put({ step: "sizes" });
  await link.down();
  const queued = await convo.agentState.put({ step: "checkout" }, { mode: "cas", ifVersion: 1n });
  assert.equal(queued.reason, "pending");

  // Meanwhile another process of the same agent moves the state on.
  const other = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: open });
  await other.conversation("c-5").agentState.put({ offer: "o-2" });

  await link.up();
  const state = await convo.agentState.get(); // sends the queue first
  assert.deepEqual(state.body, { step: "sizes", offer: "o-2" });
  assert.equal(state.version, 2n);
  const [conflict] = convo.agentState.conflicts;
  assert.equal(convo.agentState.conflicts.length, 1);
  assert.deepEqual(conflict.write.body, { step: "checkout" });
  assert.equal(conflict.write.ifVersion, 1n);
  assert.equal(conflict.error.code, "agent_state_conflict");
  assert.equal(bot.conversation("other").agentState.conflicts.length, 0);
  assert.equal(convo.agentState.pending.length, 0);
  await link.down();
});

test("read your writes: a read older than the version written is served from what the SDK knows", async () => {
  const { open, namespace } = await space();
  // A replica behind: agent-state reads answer the state as it was at version 1.
  let frozen = null;
  const lagging = async (url, init) => {
    const answer = await fetch(url, init);
    if (!String(url).endsWith("/v1/agent-state/read")) return answer;
    const text = await answer.text();
    frozen ??= text;
    return new Response(frozen, { status: answer.status, headers: answer.headers });
  };
  const bot = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: open, fetch: lagging });
  const convo = bot.conversation("c-6");
  await convo.agentState.put({ step: "sizes" });
  const first = await convo.agentState.get(); // freezes version 1
  assert.equal(first.version, 1n);
  const written = await convo.agentState.put({ offer: "o-3" });
  assert.equal(written.version, 2n);
  const later = await convo.agentState.get();
  assert.equal(later.version, 2n);
  assert.deepEqual(later.body, { step: "sizes", offer: "o-3" });
});
