// What the TypeScript extension itself answers on a session file, and how long its own code takes:
// its recall tool (src/tools/recall-observation.ts) for each memory id, and its compaction hook's fold
// (src/session-ledger: buildCompactionProjection + renderSummary) at each cut. Loaded from the
// extension's own source with the jiti Pi ships (read, never copied into om); Pi 1.6.0 parses and
// migrates the file as it does when it opens it.
//
// Usage: node bench/conformance/extension_answers.mjs PI_NODE_MODULES EXTENSION_CHECKOUT REQUEST.json
//   REQUEST: {"file": ..., "leaf": ID|null, "ids": [...], "cuts": [...], "poolMaxTokens": N, "repeat": N}
// Prints {"recall": {id: {"text", "details", "ms": [...]}}, "compaction": {cut: {"summary", "ms": [...]}}}.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [modules, extension, requestFile] = process.argv.slice(2).map((p) => path.resolve(p));
const request = JSON.parse(fs.readFileSync(requestFile, "utf8"));
const require = createRequire(path.join(modules, "x.js"));
const entry = (name) => path.join(modules, name, "dist/index.js");
const { createJiti } = require("jiti");
const jiti = createJiti(import.meta.url, {
  alias: {
    "@earendil-works/pi-coding-agent": entry("@earendil-works/pi-coding-agent"),
    // what Pi's own loader maps it to for extensions (its view of pi-ai, with typebox's Type)
    "@earendil-works/pi-ai": path.join(modules, "@earendil-works/pi-coding-agent/dist/core/extensions/pi-ai-extension-view.js"),
    "@earendil-works/pi-agent-core": entry("@earendil-works/pi-agent-core"),
    "@earendil-works/pi-tui": entry("@earendil-works/pi-tui"),
    typebox: path.join(modules, "typebox/build/index.mjs"),
  },
});
const sm = await import(path.join(modules, "@earendil-works/pi-coding-agent/dist/core/session-manager.js"));
const ledger = await jiti.import(path.join(extension, "src/session-ledger/index.ts"));
const tool = (await jiti.import(path.join(extension, "src/tools/recall-observation.ts"))).recallObservationTool;

const all = sm.parseSessionEntries(fs.readFileSync(request.file, "utf8"));
sm.migrateSessionEntries(all);
const entries = all.filter((e) => e.type !== "session");
const byId = new Map(entries.map((e) => [e.id, e]));
const branch = [];
for (let cur = request.leaf ? byId.get(request.leaf) : entries.at(-1); cur; cur = cur.parentId ? byId.get(cur.parentId) : undefined) {
  branch.push(cur);
}
branch.reverse();
const ctx = { sessionManager: { getBranch: () => branch } };
const repeat = request.repeat ?? 5;
const timed = async (fn) => {
  const ms = [];
  let value;
  for (let i = 0; i < repeat; i++) {
    const started = performance.now();
    value = await fn();
    ms.push(performance.now() - started);
  }
  return { value, ms };
};

const out = { recall: {}, compaction: {} };
for (const id of request.ids ?? []) {
  const { value, ms } = await timed(() => tool.execute("bench", { id }, undefined, undefined, ctx));
  out.recall[id] = { text: value.content[0].text, details: value.details, ms };
}
for (const cut of request.cuts ?? []) {
  const { value, ms } = await timed(() => {
    const projection = ledger.buildCompactionProjection(branch, cut, { observationsPoolMaxTokens: request.poolMaxTokens ?? 20000 });
    return ledger.renderSummary(projection.reflections, projection.observations);
  });
  out.compaction[cut] = { summary: value, ms };
}
console.log(JSON.stringify(out));
