// What the package is: ESM with declarations, built files only, lossless versions.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { after, test } from "node:test";
import { Agent, parse, stringify } from "@loom/sdk";
import { PACKAGE_ROOT, freshNamespace, servers } from "./support.mjs";

test("npm pack ships only the built files", () => {
  const npm = process.platform === "win32" ? "npm.cmd" : "npm";
  const [packed] = JSON.parse(execFileSync(npm, ["pack", "--dry-run", "--json", "--ignore-scripts"],
    { cwd: PACKAGE_ROOT, encoding: "utf8" }));
  const paths = packed.files.map((file) => file.path).sort();
  assert.ok(paths.includes("dist/index.js") && paths.includes("dist/index.d.ts"));
  assert.ok(paths.includes("dist/generated/ops.js") && paths.includes("dist/generated/errors.d.ts"));
  const other = paths.filter((path) => !/^dist\/.*\.(js|d\.ts)$/.test(path));
  assert.deepEqual(other, ["README.md", "package.json"]);
  assert.equal(packed.name, "@loom/sdk");
});

test("big integers survive the JSON round trip; other numbers stay numbers", () => {
  const text = '{"version":1796168385513155001,"count":3,"ratio":0.5,"nested":[{"expires_at":12}],"big":9007199254740993,"s":"a\\"b"}';
  const found = parse(text, new Set(["version", "expires_at"]));
  assert.equal(found.version, 1796168385513155001n);
  assert.equal(found.count, 3);
  assert.equal(found.ratio, 0.5);
  assert.equal(found.nested[0].expires_at, 12n);
  assert.equal(found.big, 9007199254740993n);
  assert.equal(found.s, 'a"b');
  assert.equal(stringify({ if_version: 1796168385513155001n, skipped: undefined, list: [1, "x"] }),
    '{"if_version":1796168385513155001,"list":[1,"x"]}');
  assert.throws(() => parse('{"a":1} x'), SyntaxError);
});

test("a memory row's version from the live server is exact: it equals version_text", async () => {
  const bot = new Agent({ org: "acme", namespace: freshNamespace("versions"), agent: "a1", baseUrl: servers().open });
  const row = await bot.client.memory.set({ key: "k", value: "v" });
  assert.equal(typeof row.version, "bigint");
  assert.ok(row.version > BigInt(Number.MAX_SAFE_INTEGER));
  assert.equal(row.version.toString(), row.version_text);
  // The exact version goes back as an integer: the delete names that very version.
  const removed = await bot.client.memory.deleteVersion({ key: "k", version: row.version });
  assert.equal(removed.removed_version, row.version);
});

test("the planes: working memory, profile, context pack, with the Agent's identity", async () => {
  const bot = new Agent({ org: "acme", namespace: freshNamespace("planes"), agent: "triage-bot", baseUrl: servers().open });
  await bot.workingMemory.set("cursor: ticket 4812", "state", { runId: "run-7" });
  await bot.workingMemory.append("step 3 done", "state", { runId: "run-7" });
  const rendered = await bot.workingMemory.render({ runId: "run-7" });
  assert.match(rendered.rendered, /cursor: ticket 4812\nstep 3 done/);
  await bot.profile.set("persona", "Terse. Cite ticket ids.");
  await bot.profile.append("preferences", "Prefers EUR invoices.", { userId: "u-42" });
  const section = await bot.profile.get("preferences", { userId: "u-42" });
  assert.equal(section.found, true);
  const listed = await bot.profile.list({ userId: "u-42" });
  assert.ok(listed.memories.some((row) => row.key === "preferences"));
  const packed = await bot.context.pack({ run_id: "run-7" });
  assert.match(packed.pack, /^<working-memory block="state">cursor: ticket 4812/);
  assert.match(packed.pack, /<profile label="persona">Terse/);
  assert.match((await bot.context.pack({ user_id: "u-42" })).pack, /Prefers EUR invoices/);
  assert.equal(typeof packed.stable_prefix_chars, "number");
  assert.equal((await bot.profile.delete("preferences", { userId: "u-42" })).deleted, true);
});

test("the packed tarball installs into another project, imports as ESM and type-checks", async () => {
  const { mkdtempSync, rmSync, writeFileSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  const { join } = await import("node:path");
  const npm = process.platform === "win32" ? "npm.cmd" : "npm";
  const project = mkdtempSync(join(tmpdir(), "loom-sdk-user-"));
  after(() => rmSync(project, { recursive: true, force: true }));
  const [packed] = JSON.parse(execFileSync(npm, ["pack", "--json", "--ignore-scripts", "--pack-destination", project],
    { cwd: PACKAGE_ROOT, encoding: "utf8" }));
  writeFileSync(join(project, "package.json"), JSON.stringify({ name: "user", private: true, type: "module" }));
  execFileSync(npm, ["install", "--no-fund", "--no-audit", "--offline", "--loglevel=error", join(project, packed.filename)],
    { cwd: project, encoding: "utf8" });
  const loaded = execFileSync(process.execPath, ["--input-type=module", "-e",
    'const sdk = await import("@loom/sdk"); console.log(typeof sdk.Agent, JSON.stringify(sdk.DELETE));'],
  { cwd: project, encoding: "utf8" });
  assert.equal(loaded.trim(), 'function {"$delete":true}');
  writeFileSync(join(project, "main.ts"), [
    'import { Agent, DELETE, errors } from "@loom/sdk";',
    'const bot = new Agent({ org: "acme", namespace: "shop", agent: "a", baseUrl: "http://127.0.0.1:1" });',
    'const state = await bot.conversation("c").agentState.get();',
    'const version: bigint = state.version;',
    'await bot.conversation("c").agentState.put({ offer: DELETE }, { mode: "cas", ifVersion: version });',
    'export const known: boolean = errors.AgentStateConflict.prototype instanceof errors.PreconditionFailed;',
  ].join("\n"));
  const tsc = join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc");
  writeFileSync(join(project, "tsconfig.json"), JSON.stringify({
    compilerOptions: { target: "ES2022", module: "NodeNext", moduleResolution: "NodeNext",
      lib: ["ES2022", "DOM"], types: [], skipLibCheck: true },
    files: ["main.ts"],
  }));
  const checked = spawnSync(process.execPath, [tsc, "--noEmit", "--strict", "-p", "tsconfig.json"],
    { cwd: project, encoding: "utf8" });
  assert.equal(checked.status, 0, checked.stdout + checked.stderr);
});
