// One error class per code: provoked on the live servers where an SDK call can reach the code,
// and for every code of the server's table, the class errorFromAnswer picks.
import assert from "node:assert/strict";
import { createServer } from "node:net";
import { once } from "node:events";
import { test } from "node:test";
import { Agent, ERROR_STATUS, errorFromAnswer, errors } from "@loom/sdk";
import { AGENT_TYPE, freshNamespace, servers, startServers } from "./support.mjs";

function agent(options = {}) {
  return new Agent({ org: "acme", namespace: freshNamespace("errors"), agent: "a1",
    baseUrl: servers().open, retry: false, ...options });
}

async function thrown(promise) {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail("expected an error");
}

function assertClass(error, Class, code, status) {
  assert.ok(error instanceof Class, `${error} is not a ${Class.name}`);
  assert.ok(error instanceof errors.LoomError);
  assert.equal(error.code, code);
  assert.equal(error.status, status);
}

test("the live server's refusals arrive as their code's class, with the details", async () => {
  const bot = agent();
  await bot.workingMemory.set("abc", "b1");
  let error = await thrown(bot.workingMemory.replace("x", "y", { blockKey: "nope" }));
  assertClass(error, errors.WorkingMemoryBlockNotFound, "WORKING_MEMORY_BLOCK_NOT_FOUND", 404);
  assert.ok(error instanceof errors.NotFound);
  error = await thrown(bot.workingMemory.replace("zzz", "y", { blockKey: "b1" }));
  assertClass(error, errors.SubstringNotFound, "SUBSTRING_NOT_FOUND", 422);
  error = await thrown(bot.workingMemory.set("x".repeat(50), "b2", { charLimit: 10 }));
  assertClass(error, errors.WorkingMemoryLimitExceeded, "WORKING_MEMORY_LIMIT_EXCEEDED", 422);
  assert.ok(error instanceof errors.LimitExceeded);
  assert.deepEqual([error.valueLength, error.charLimit], [50, 10]);
  error = await thrown(bot.profile.replace("nolabel", "a", "b"));
  assertClass(error, errors.ProfileSectionNotFound, "PROFILE_SECTION_NOT_FOUND", 404);
  error = await thrown(bot.profile.set("p1", "x".repeat(50), { charLimit: 10 }));
  assertClass(error, errors.CharLimitExceeded, "CHAR_LIMIT_EXCEEDED", 422);
  await bot.profile.set("p2", "hello");
  error = await thrown(bot.profile.set("p2", "x", { ifMatchSha256: "0".repeat(64) }));
  assertClass(error, errors.HashMismatch, "HASH_MISMATCH", 409);
  assert.ok(error instanceof errors.Conflict);
  // What to do and each detail, typed, from the server's catalogue.
  assert.equal(error.remedy, "read_then_resend");
  assert.equal(error.key, "p2");
  assert.match(error.contentSha256, /^[0-9a-f]{64}$/);
  error = await thrown(bot.client.memory.deleteVersion({ key: "nokey", version: 1 }));
  assertClass(error, errors.MemoryNotFound, "MEMORY_NOT_FOUND", 404);
  await bot.client.memory.set({ key: "fact", value: "v" });
  error = await thrown(bot.profile.set("fact", "x"));
  assertClass(error, errors.MemoryTypeMismatch, "MEMORY_TYPE_MISMATCH", 409);
  await bot.client.memory.lock({ key: "fact" });
  error = await thrown(bot.client.memory.set({ key: "fact", value: "w" }));
  assertClass(error, errors.MemoryLocked, "MEMORY_LOCKED", 409);
  error = await thrown(bot.client.token.revoke({ token_id: "nope" }));
  assertClass(error, errors.TokenNotFound, "TOKEN_NOT_FOUND", 404);
  error = await thrown(new Agent({ baseUrl: servers().open, retry: false }).workingMemory.set("x"));
  assertClass(error, errors.IdentityIncomplete, "IDENTITY_INCOMPLETE", 422);
  error = await thrown(bot.client.workingMemory.render({ limit: -5 }));
  assertClass(error, errors.ValidationError, "VALIDATION_ERROR", 422);
  assert.deepEqual(Object.keys(error.fields), ["limit"]);
  error = await thrown(bot.client.objectTypes.set({ types: [{ type: "x", ownership: "nope" }] }));
  assertClass(error, errors.SchemaInvalid, "SCHEMA_INVALID", 422);
  assert.equal(typeof error.rule, "string");
  assert.equal(Object.keys(error.fields).length, 1);
  error = await thrown(bot.conversation("c").agentState.get());
  assertClass(error, errors.FeatureDisabled, "FEATURE_DISABLED", 403);
  await bot.client.features.set({ features: { agent_state: true } });
  await bot.client.objectTypes.set({ types: [{ ...AGENT_TYPE, type: "a1_state" }] });
  error = await thrown(bot.client.agentState.put({ scope: { kind: "conversation", id: "c" }, body: {}, mode: "cas", if_version: 3 }));
  assertClass(error, errors.AgentStateConflict, "agent_state_conflict", 412);
  assert.equal(error.details.version, 0n);
  error = await thrown(bot.workingMemory.set("x".repeat(300_000), "big"));
  assertClass(error, errors.BodyTooLarge, "BODY_TOO_LARGE", 413);
  assert.ok(error instanceof errors.PayloadTooLarge);
  error = await thrown(bot.transport.send("nope.nope", {}));
  assertClass(error, errors.UnknownOp, "UNKNOWN_OP", 404);
});

test("auth refusals on the server with auth on", async () => {
  const { guarded, admin_token } = servers();
  const namespace = freshNamespace("auth");
  let error = await thrown(new Agent({ namespace, baseUrl: guarded, retry: false }).workingMemory.get("x"));
  assertClass(error, errors.AuthRequired, "AUTH_REQUIRED", 401);
  assert.ok(error instanceof errors.Unauthorized);
  error = await thrown(new Agent({ namespace, baseUrl: guarded, token: "bad", retry: false }).workingMemory.get("x"));
  assertClass(error, errors.AuthInvalid, "AUTH_INVALID", 401);
  const admin = new Agent({ org: "acme", namespace, baseUrl: guarded, token: admin_token, retry: false });
  const viewer = await admin.client.token.create({ role: "viewer", agent: "a1" });
  error = await thrown(new Agent({ namespace, agent: "a1", baseUrl: guarded, token: viewer.token, retry: false }).workingMemory.set("x"));
  assertClass(error, errors.AuthInsufficient, "AUTH_INSUFFICIENT", 403);
  assert.ok(error instanceof errors.Forbidden);
});

test("over the request budget: RateLimited with Retry-After, thrown at once when longer than maxWaitMs", async () => {
  const { guarded, admin_token, rate_limit } = servers();
  const namespace = freshNamespace("limit");
  const admin = new Agent({ org: "acme", namespace, baseUrl: guarded, token: admin_token });
  const minted = await admin.client.token.create({ role: "writer", agent: "a1" });
  const waits = [];
  const bot = new Agent({ namespace, agent: "a1", baseUrl: guarded, token: minted.token,
    retry: { sleep: async (ms) => { waits.push(ms); }, maxWaitMs: 10_000 } });
  const budget = Number(rate_limit.split("/")[0]);
  let error = null;
  for (let call = 0; call <= budget && error === null; call += 1) {
    error = await bot.workingMemory.get("x").then(() => null, (found) => found);
  }
  assertClass(error, errors.RateLimited, "RATE_LIMITED", 429);
  assert.ok(error.retryAfter > 10, `retry after ${error.retryAfter} s`);
  assert.equal(error.response.headers.get("Retry-After"), String(error.details.retry_after));
  assert.deepEqual(waits, [], "a wait longer than maxWaitMs is not slept");
});

test("real answers no SDK call provokes: unknown route, wrong method, bad JSON, wrong type", async () => {
  const { open } = servers();
  const cases = [
    [fetch(`${open}/nowhere`), errors.NotFound, "NOT_FOUND", 404],
    [fetch(`${open}/v1/working_memory.set`, { method: "GET" }), errors.MethodNotAllowed, "METHOD_NOT_ALLOWED", 405],
    [fetch(`${open}/v1/working_memory.get`, { method: "POST", headers: { "Content-Type": "application/json" }, body: "{" }),
      errors.MalformedJson, "MALFORMED_JSON", 400],
    [fetch(`${open}/v1/working_memory.get`, { method: "POST", headers: { "Content-Type": "text/plain" }, body: "hi" }),
      errors.UnsupportedContentType, "UNSUPPORTED_CONTENT_TYPE", 400],
  ];
  for (const [sent, Class, code, status] of cases) {
    const response = await sent;
    const error = errorFromAnswer(response.status, (await response.json()).error, response);
    assertClass(error, Class, code, status);
    assert.ok(error instanceof errors.BadRequest || status !== 400);
  }
});

test("every code of the server's error table has its class, status parent and code", () => {
  assert.ok(Object.keys(ERROR_STATUS).length >= 30);
  for (const [code, status] of Object.entries(ERROR_STATUS)) {
    const error = errorFromAnswer(status, { code, message: "m", extra: 1 });
    assert.equal(error.code, code);
    assert.equal(error.status, status);
    assert.equal(error.details.extra, 1);
    assert.equal(error.constructor.code, code, `${code} has a class of its own`);
    const parent = { 400: errors.BadRequest, 401: errors.Unauthorized, 403: errors.Forbidden,
      404: errors.NotFound, 405: errors.MethodNotAllowed, 409: errors.Conflict,
      412: errors.PreconditionFailed, 413: errors.PayloadTooLarge, 421: errors.MisdirectedRequest,
      422: errors.Unprocessable, 429: errors.RateLimited }[status] ?? errors.ServerError;
    assert.ok(error instanceof parent, `${code} is a ${parent.name}`);
  }
  // A code this SDK does not know falls back on its status, then on 5xx, then the root.
  assert.equal(errorFromAnswer(404, { code: "NEW_404" }).constructor, errors.NotFound);
  assert.equal(errorFromAnswer(502, null).constructor, errors.ServerError);
  assert.equal(errorFromAnswer(502, null).code, "HTTP_502");
  assert.equal(errorFromAnswer(418, { code: "TEAPOT" }).constructor, errors.LoomAPIError);
});

test("no answer: a refused connection and a server that never answers", async () => {
  const silent = createServer(() => {}); // accepts and never answers
  silent.listen(0, "127.0.0.1");
  await once(silent, "listening");
  const closed = createServer();
  closed.listen(0, "127.0.0.1");
  await once(closed, "listening");
  const refusedPort = closed.address().port;
  await new Promise((done) => closed.close(done));
  let error = await thrown(agent({ baseUrl: `http://127.0.0.1:${refusedPort}` }).workingMemory.get("x"));
  assert.ok(error instanceof errors.LoomConnectionError);
  assert.equal(error.code, "CONNECTION_ERROR");
  assert.equal(error.status, null);
  assert.equal(error.mayHaveReachedServer, false);
  error = await thrown(agent({ baseUrl: `http://127.0.0.1:${silent.address().port}`, timeoutMs: 300 }).workingMemory.get("x"));
  assert.ok(error instanceof errors.LoomTimeout);
  assert.equal(error.code, "TIMEOUT");
  silent.close();
});

test("the store down: StoreUnavailable with Retry-After; a read is sent again, a keyed write until the store is back", async () => {
  const own = await startServers("open");
  try {
    const bot = new Agent({ org: "acme", namespace: "store", agent: "a1", baseUrl: own.open,
      retry: { sleep: async () => {}, attempts: 3 } });
    await bot.workingMemory.set("kept", "b1");
    await own.command("store stop");
    const sent = [];
    const counting = new Agent({ org: "acme", namespace: "store", agent: "a1", baseUrl: own.open,
      fetch: (url, init) => { sent.push(String(url)); return fetch(url, init); },
      retry: { sleep: async () => {}, attempts: 3 } });
    let error = await thrown(counting.workingMemory.get("b1"));
    assertClass(error, errors.StoreUnavailable, "STORE_UNAVAILABLE", 503);
    assert.ok(error instanceof errors.ServerError);
    assert.equal(typeof error.retryAfter, "number");
    assert.equal(error.response.headers.get("Retry-After"), String(error.retryAfter));
    assert.equal(sent.length, 3, "a read is tried three times");
    sent.length = 0;
    let waits = 0;
    const patient = new Agent({ org: "acme", namespace: "store", agent: "a1", baseUrl: own.open,
      fetch: (url, init) => { sent.push(String(url)); return fetch(url, init); },
      retry: { attempts: 3, sleep: async () => { waits += 1; if (waits === 4) await own.command("store start"); } } });
    // Past its three attempts: only an answer says whether the append applied.
    const appended = await patient.workingMemory.append("once", "b1");
    assert.ok(sent.length >= 5, "sent again with its key until the store answered");
    assert.equal(appended.block_key, "b1");
    // The test store starts again empty: the block holds the append once.
    assert.equal((await bot.workingMemory.get("b1")).content, "once", "applied once");
  } finally {
    assert.equal(await own.stop(), 0);
  }
});

test("a keyed write to a refusing address fails after its attempts, not its total", async () => {
  const closed = createServer();
  closed.listen(0, "127.0.0.1");
  await once(closed, "listening");
  const refusedPort = closed.address().port;
  await new Promise((done) => closed.close(done));
  const started = Date.now();
  const error = await thrown(agent({
    baseUrl: `http://127.0.0.1:${refusedPort}`,
    retry: { attempts: 3, backoffMs: 10, maxWaitMs: 10, totalMs: 30_000 },
  }).workingMemory.set("x", "b"));
  assert.ok(error instanceof errors.LoomConnectionError);
  assert.equal(error.mayHaveReachedServer, false);
  // Three tries 10 ms apart: nothing reached the server, so no 30 s of refusals.
  assert.ok(Date.now() - started < 10_000, `took ${Date.now() - started} ms`);
});
