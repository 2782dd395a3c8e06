// `npm test`: start the live servers once, run every test file against them, one file at a
// time (the store test stops its own server), and fail when any answer broke the document.
import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import { join } from "node:path";
import { PACKAGE_ROOT, startServers } from "./support.mjs";

const live = await startServers();
let status = 1;
try {
  const folder = join(PACKAGE_ROOT, "test");
  const files = readdirSync(folder).filter((name) => name.endsWith(".test.mjs")).sort()
    .map((name) => join(folder, name));
  const run = spawnSync(process.execPath, ["--test", "--test-concurrency=1", ...files], {
    cwd: PACKAGE_ROOT, stdio: "inherit",
    env: { ...process.env, LOOM_TS_TEST_SERVERS: JSON.stringify(live) },
  });
  status = run.status ?? 1;
} finally {
  const stopped = await live.stop();
  if (stopped !== 0) {
    console.error("the test servers reported answers that broke the OpenAPI document");
    status = status || 1;
  }
}
process.exit(status);
