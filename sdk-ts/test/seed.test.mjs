// The seed's TypeScript snippet (seed 002), as written apart from its import line, run against
// the live server; and the type check of a user's script under --strict.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { join } from "node:path";
import { test } from "node:test";
import { Agent } from "@loom/sdk";
import { AGENT_TYPE, PACKAGE_ROOT, freshNamespace, servers } from "./support.mjs";

const TSC = join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc");

function tsc(...args) {
  return spawnSync(process.execPath, [TSC, ...args], { cwd: PACKAGE_ROOT, encoding: "utf8" });
}

test("a user's script type-checks with tsc --noEmit --strict against the built package", () => {
  const checked = tsc("--noEmit", "--strict", "-p", "test/user/tsconfig.json");
  assert.equal(checked.status, 0, checked.stdout + checked.stderr);
});

test("the types refuse a rounded version, an unknown mode, a missing field and a typo", () => {
  const checked = tsc("--noEmit", "--strict", "-p", "test/user-wrong/tsconfig.json");
  assert.notEqual(checked.status, 0);
  const found = checked.stdout;
  assert.match(found, /script\.ts\(7,7\): error TS2322: Type 'bigint' is not assignable to type 'number'/);
  assert.match(found, /script\.ts\(8,\d+\): error TS2322: Type '"swap"'/);
  assert.match(found, /script\.ts\(9,\d+\): [^]*Property 'value' is missing/);
  assert.match(found, /script\.ts\(10,\d+\): .*Property 'sett' does not exist/);
});

test("the seed's snippet runs as written: merge, a cas at the version read that conflicts, a DELETE", async () => {
  const { open } = servers();
  const namespace = freshNamespace("seed");
  const admin = new Agent({ namespace, baseUrl: open });
  await admin.client.features.set({ features: { agent_state: true } });
  await admin.client.objectTypes.set({ types: [AGENT_TYPE] });
  const built = tsc("-p", "test/user/tsconfig.json");
  assert.equal(built.status, 0, built.stdout + built.stderr);

  const run = () => execFileSync(process.execPath, [join(PACKAGE_ROOT, "build", "user", "seed_002.js")], {
    encoding: "utf8",
    env: { ...process.env, LOOM_API_URL: open, SEED_NAMESPACE: namespace, SEED_CONVERSATION: "c-1" },
  });
  assert.equal(run(), ""); // the merge was stored: nothing printed

  const bot = new Agent({ org: "acme", namespace, agent: "shopping_assistant", baseUrl: open });
  const after = await bot.conversation("c-1").agentState.get();
  // The merge stored version 1; the cas at version 0 lost (412) and changed nothing; the
  // DELETE removed offer and kept step.
  assert.deepEqual(after.body, { step: "sizes" });
  assert.equal(after.version, 2n);

  // Again over the existing state: the cas at the version read still loses to the merge.
  assert.equal(run(), "");
  const again = await bot.conversation("c-1").agentState.get();
  assert.deepEqual(again.body, { step: "sizes" });
  assert.equal(again.version, 4n);
});
