// Drive `promptforge mcp` with the official TypeScript SDK's client (from npm,
// installed by tests/tools/setup.sh node-mcp DIR), the way a JavaScript MCP
// client such as the Inspector does.
//
// Usage:
//   node ts_client.mjs NODE_DIR stdio BIN PROMPTS_DIR
//   node ts_client.mjs NODE_DIR http URL
//
// The server must allow one run at a time (--max-concurrent 1) with a queue,
// so the cancel scenario shows the slot coming back. Each scenario prints
// `ok NAME`; the first failure exits non-zero. Waits never assert on time.

import path from "node:path";
import { pathToFileURL } from "node:url";

const [nodeDir, mode, target, promptsDir] = process.argv.slice(2);
const sdk = (file) =>
  import(pathToFileURL(path.join(nodeDir, "node_modules/@modelcontextprotocol/sdk/dist/esm", file)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
const { EmptyResultSchema } = await sdk("types.js");

function check(condition, what) {
  if (!condition) {
    throw new Error(`check failed: ${what}`);
  }
}

function transport() {
  if (mode === "stdio") {
    return new StdioClientTransport({
      command: target,
      args: ["mcp", promptsDir, "--max-concurrent", "1", "--queue", "4"],
      env: { ...process.env, PROMPTFORGE_LOG: "warn" },
      stderr: "ignore",
    });
  }
  return new StreamableHTTPClientTransport(new URL(target));
}

const textOf = (result) => result.content.filter((c) => c.type === "text").map((c) => c.text).join("");

const client = new Client({ name: "promptforge-ts-test", version: "1.0.0" });
await client.connect(transport());

{
  await client.ping();
  const tools = (await client.listTools()).tools.map((t) => t.name);
  check(tools.includes("echo") && tools.includes("spin"), `tools: ${tools}`);
  console.log("ok list");
}

{
  const seen = [];
  const result = await client.callTool({ name: "echo", arguments: { prose: "ts" } }, undefined, {
    onprogress: (p) => seen.push(p.message),
  });
  check(textOf(result) === "echo: ts", textOf(result));
  check(seen.includes("section Second") && seen.includes("Second: log: second"), JSON.stringify(seen));
  const notes = [];
  await client.callTool({ name: "notes", arguments: {} }, undefined, { onprogress: (p) => notes.push(p.message) });
  check(notes.includes("Take notes: tool grab succeeded"), JSON.stringify(notes));
  console.log("ok call_and_progress");
}

{
  // JavaScript reads numbers as doubles: a seed must survive that unchanged.
  for (let i = 0; i < 8; i++) {
    const result = await client.callTool({ name: "echo", arguments: { prose: "seed" } });
    const seed = result.structuredContent.seed;
    check(Number.isSafeInteger(seed) && seed >= 0, `seed ${seed}`);
  }
  console.log("ok seeds");
}

{
  let code;
  try {
    await client.request({ method: "no/such-method", params: {} }, EmptyResultSchema);
  } catch (error) {
    code = error.code;
  }
  check(code === -32601, `unknown method: ${code}`);
  // The session goes on.
  const result = await client.callTool({ name: "echo", arguments: { prose: "after" } });
  check(textOf(result) === "echo: after", textOf(result));
  console.log("ok unknown_method");
}

{
  // Abort a call once its run is going: notifications/cancelled ends the run
  // and frees the one slot, so the next call runs.
  const abort = new AbortController();
  let started;
  const running = new Promise((resolve) => (started = resolve));
  const spin = client
    .callTool({ name: "spin", arguments: { index: 0 } }, undefined, {
      signal: abort.signal,
      onprogress: () => started(),
      timeout: 600000,
    })
    .then(
      () => "completed",
      (error) => (abort.signal.aborted ? "aborted" : `failed: ${error}`)
    );
  await running;
  abort.abort("the user stopped it");
  check((await spin) === "aborted", "the spin call ended by the abort");
  const result = await client.callTool({ name: "echo", arguments: { prose: "freed" } }, undefined, {
    timeout: 600000,
  });
  check(textOf(result) === "echo: freed", textOf(result));
  console.log("ok cancel");
}

await client.close();
