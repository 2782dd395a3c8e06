// Retry rules on a scripted HTTP server: Retry-After honoured, the same Idempotency-Key on
// every try, and a write never sent again once it may have run.
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

test("a 503 sends a read again after Retry-After and a write never", async () => {
  const server = await scriptedServer([DOWN, { status: 200, body: { found: false, ignored_args: [] } }, DOWN]);
  const { waits, policy } = recordedWaits();
  const agent = bot(server.url, policy);
  assert.equal((await agent.workingMemory.get("b")).found, false);
  assert.deepEqual(waits, [1000]);
  await assert.rejects(agent.workingMemory.append("once", "b"), errors.StoreUnavailable);
  assert.equal(server.seen.length, 3, "the append was sent once");
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
