// Test helpers: the live servers (started by tests/support/ts_sdk_server.py), a TCP relay that
// can be taken down (a real refused connection), and a scripted HTTP server for retry rules.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { createServer as createHttpServer } from "node:http";
import { createServer as createTcpServer, connect } from "node:net";
import { dirname, join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const PACKAGE_ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
export const REPO_ROOT = join(PACKAGE_ROOT, "..");
export const PYTHON = process.env.LOOM_PYTHON ?? join(REPO_ROOT, ".venv", "bin", "python");

/** Start the live servers: resolves to { open, guarded, admin_token, command(), stop() }. */
export async function startServers(names = "open,guarded") {
  const child = spawn(PYTHON, ["-m", "tests.support.ts_sdk_server", names], {
    cwd: REPO_ROOT, stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const waiting = [];
  const queued = [];
  lines.on("line", (line) => (waiting.length ? waiting.shift()(line) : queued.push(line)));
  const nextLine = () => new Promise((resolve, reject) => {
    if (queued.length) return resolve(queued.shift());
    waiting.push(resolve);
    child.once("exit", (code) => reject(new Error(`the test servers exited (${code})`)));
  });
  const started = JSON.parse(await nextLine());
  const exited = once(child, "exit");
  return {
    ...started,
    async command(text) {
      child.stdin.write(text + "\n");
      const answer = await nextLine();
      if (answer !== "ok") throw new Error(`server command ${text}: ${answer}`);
    },
    async stop() {
      child.stdin.end();
      const [code] = await exited;
      return code;
    },
  };
}

/** The servers `test/run.mjs` started for the whole run. */
export function servers() {
  const given = process.env.LOOM_TS_TEST_SERVERS;
  if (!given) throw new Error("run the tests with `npm test` (test/run.mjs starts the servers)");
  return JSON.parse(given);
}

let namespaces = 0;
/** A namespace no other test uses. */
export function freshNamespace(prefix) {
  namespaces += 1;
  return `${prefix}-${process.pid}-${namespaces}`;
}

/** A TCP relay to `target` (http://host:port): `url` reaches the target while up; down,
 * every connection is refused and the open ones are cut. */
export async function relay(target) {
  const { hostname, port } = new URL(target);
  const sockets = new Set();
  let server = null;
  let listenPort = 0;
  const up = async () => {
    server = createTcpServer((socket) => {
      const upstream = connect(Number(port), hostname);
      sockets.add(socket);
      sockets.add(upstream);
      socket.pipe(upstream).pipe(socket);
      const drop = () => { socket.destroy(); upstream.destroy(); };
      socket.on("error", drop);
      upstream.on("error", drop);
      socket.on("close", drop);
      upstream.on("close", drop);
    });
    server.listen(listenPort, "127.0.0.1");
    await once(server, "listening");
    listenPort = server.address().port;
  };
  const down = async () => {
    for (const socket of sockets) socket.destroy();
    sockets.clear();
    await new Promise((done) => server.close(() => done()));
  };
  await up();
  return { get url() { return `http://127.0.0.1:${listenPort}`; }, up, down };
}

/** An HTTP server that answers each request with the next scripted answer and records what
 * it was sent: `answers` are { status, body, headers }, or { cut: true } to close the
 * connection once the request is read, with no answer (the request reached the server). */
export async function scriptedServer(answers) {
  const seen = [];
  const server = createHttpServer((request, response) => {
    let body = "";
    request.on("data", (chunk) => (body += chunk));
    request.on("end", () => {
      seen.push({ method: request.method, url: request.url, headers: request.headers, body });
      const next = answers.shift() ?? { status: 500, body: { error: { code: "INTERNAL_ERROR", message: "script ran out" } } };
      if (next.cut) {
        request.socket.destroy();
        return;
      }
      response.writeHead(next.status, { "Content-Type": "application/json", ...(next.headers ?? {}) });
      response.end(typeof next.body === "string" ? next.body : JSON.stringify(next.body));
    });
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    close: () => new Promise((done) => { server.closeAllConnections(); server.close(() => done()); }),
  };
}

/** A retry policy whose waits are recorded instead of slept (no wall clock in the tests). */
export function recordedWaits() {
  const waits = [];
  return { waits, policy: { sleep: async (ms) => { waits.push(ms); }, random: () => 0 } };
}

export const AGENT_TYPE = {
  type: "shopping_assistant_state",
  ownership: "agent",
  fields: {
    step: { type: "enum", values: ["sizes", "offer", "checkout"] },
    offer: { type: "string" },
    cart_note: { type: "text", pii: true },
  },
  agent_state: { scope: "conversation", max_bytes: 16384, write: "both" },
  retention: { state: "30d", cart_note: "7d" },
};
