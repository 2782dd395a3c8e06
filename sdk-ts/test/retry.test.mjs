// Retry rules on a scripted HTTP server: Retry-After honoured, the same Idempotency-Key on
// every try, a keyed write sent again until it is answered, and the answers that end it.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Agent, errors } from "@loom/sdk";
import { recordedWaits, scriptedServer } from "./support.mjs";

const OK_SET = { status: 200, body: { block_key: "b", version: 1, char_limit: 10, value_length: 1, fill_ratio: 0.1, ignored_args: [] } };
const LIMITED = { status: 429, headers: { "Retry-After": "2" }, body: { error: { code: "RATE_LIMITED", message: "slow down", retry_after: 2 } } };
const DOWN = { status: 503, headers: { "Retry-After": "1" }, body: { error: { code: "STORE_UNAVAILABLE", message: "down", retry_after: 1 } } };

function bot(url, policy) {
  return new Agent({ org: "acme", namespace: "n", agent: "a", baseUrl: url, retry: policy });
}

test("a write refused with 429 is sent again after Retry-After, with the same Idempotency-Key", async () => {
  const server = await scriptedServer([LIMITED, LIMITED, OK_SET]);
  const { waits, policy } = recordedWaits();
  const answer = await bot(server.url, policy).workingMemory.append("x", "b");
  assert.equal(answer.version, 1n);
  assert.deepEqual(waits, [2000, 2000]);
  const keys = server.seen.map((request) => request.headers["idempotency-key"]);
  assert.equal(keys.length, 3);
  assert.match(keys[0], /^[0-9a-f-]{36}$/);
  assert.equal(new Set(keys).size, 1);
  await server.close();
});

test("every write carries its own Idempotency-Key; a read carries none", async () => {
  const server = await scriptedServer([OK_SET, OK_SET, { status: 200, body: { found: false, ignored_args: [] } }]);
  const agent = bot(server.url, false);
  await agent.workingMemory.set("x", "b");
  await agent.workingMemory.append("y", "b");
  await agent.workingMemory.get("b");
  const [first, second, read] = server.seen.map((request) => request.headers["idempotency-key"]);
  assert.ok(first && second && first !== second);
  assert.equal(read, undefined);
  await server.close();
});

const RUNNING = { status: 409, headers: { "Retry-After": "1" }, body: { error: { code: "IDEMPOTENCY_IN_PROGRESS", message: "the first try is still running", retry_after: 1 } } };

function keysOf(server) {
  return server.seen.map((request) => request.headers["idempotency-key"]);
}

test("a 503 sends a read and a keyed write again after Retry-After", async () => {
  const server = await scriptedServer([DOWN, { status: 200, body: { found: false, ignored_args: [] } }, DOWN, OK_SET]);
  const { waits, policy } = recordedWaits();
  const agent = bot(server.url, policy);
  assert.equal((await agent.workingMemory.get("b")).found, false);
  assert.equal((await agent.workingMemory.append("once", "b")).version, 1n);
  assert.deepEqual(waits, [1000, 1000]);
  const [, , first, second] = keysOf(server);
  assert.ok(first && first === second, "both tries of the append carry its key");
  await server.close();
});

test("a keyed write cut off without an answer is sent again with its key", async () => {
  const server = await scriptedServer([{ cut: true }, OK_SET]);
  const { waits, policy } = recordedWaits();
  assert.equal((await bot(server.url, { ...policy, backoffMs: 50 }).workingMemory.append("x", "b")).version, 1n);
  assert.deepEqual(waits, [50]);
  const [first, second] = keysOf(server);
  assert.ok(first && first === second);
  await server.close();
});

test("a keyed write waits out a running first try past attempts, within totalMs", async () => {
  const server = await scriptedServer([RUNNING, RUNNING, RUNNING, RUNNING, OK_SET]);
  const { waits, policy } = recordedWaits();
  const answer = await bot(server.url, { ...policy, attempts: 3 }).workingMemory.append("x", "b");
  assert.equal(answer.version, 1n);
  assert.deepEqual(waits, [1000, 1000, 1000, 1000]);
  assert.equal(new Set(keysOf(server)).size, 1);
  await server.close();
  const endless = await scriptedServer([RUNNING, RUNNING, RUNNING, RUNNING]);
  let now = 0;
  const bounded = { ...policy, totalMs: 2500, now: () => now, sleep: async (ms) => { waits.push(ms); now += ms; } };
  waits.length = 0;
  await assert.rejects(bot(endless.url, bounded).workingMemory.append("x", "b"), errors.IdempotencyInProgress);
  assert.deepEqual(waits, [1000, 1000], "no try starts past totalMs");
  await endless.close();
});

test("an unknown outcome and a reused key end a keyed write at once; retry false sends once", async () => {
  const unknown = { status: 409, body: { error: { code: "IDEMPOTENCY_OUTCOME_UNKNOWN", message: "may have been applied" } } };
  const reused = { status: 422, body: { error: { code: "IDEMPOTENCY_KEY_REUSED", message: "another body" } } };
  const server = await scriptedServer([unknown, reused, RUNNING]);
  const { waits, policy } = recordedWaits();
  const agent = bot(server.url, policy);
  await assert.rejects(agent.workingMemory.append("x", "b"), errors.IdempotencyOutcomeUnknown);
  await assert.rejects(agent.workingMemory.append("x", "b"), errors.IdempotencyKeyReused);
  await assert.rejects(bot(server.url, false).workingMemory.append("x", "b"), errors.IdempotencyInProgress);
  assert.deepEqual(waits, []);
  assert.equal(server.seen.length, 3);
  await server.close();
});

test("a Retry-After longer than maxWaitMs is thrown at once; attempts and totalMs bound the tries", async () => {
  const server = await scriptedServer([LIMITED, DOWN, DOWN, DOWN]);
  const { waits, policy } = recordedWaits();
  await assert.rejects(bot(server.url, { ...policy, maxWaitMs: 1000 }).workingMemory.get("b"), errors.RateLimited);
  assert.deepEqual(waits, []);
  await assert.rejects(bot(server.url, { ...policy, attempts: 2 }).workingMemory.get("b"), errors.StoreUnavailable);
  assert.deepEqual(waits, [1000]);
  assert.equal(server.seen.length, 3);
  await assert.rejects(bot(server.url, { ...policy, totalMs: 500, now: () => 0 }).workingMemory.get("b"),
    errors.StoreUnavailable);
  assert.equal(server.seen.length, 4, "a wait past totalMs is not taken");
  assert.deepEqual(waits, [1000]);
  await server.close();
});

test("without Retry-After the wait doubles from backoffMs", async () => {
  const bare = { status: 503, body: { error: { code: "STORE_UNAVAILABLE", message: "down" } } };
  const server = await scriptedServer([bare, bare, bare]);
  const { waits, policy } = recordedWaits();
  await assert.rejects(bot(server.url, { ...policy, backoffMs: 100 }).workingMemory.get("b"), errors.StoreUnavailable);
  assert.deepEqual(waits, [100, 200]);
  await server.close();
});
