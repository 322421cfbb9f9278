// Step 2 of bench/conformance/usage_clocks_vs_extension.py: at every measurement the replay made, the exported
// file's branch up to that entry (and the records appended there before it), then Pi 1.6.0's
// getContextUsage (as AgentSession computes it) and the extension's realTokensSinceAnchor, loaded
// from its own source with the jiti that Pi ships. Prints how many of om's values differ.
// Usage: node bench/conformance/usage_clocks_vs_extension.mjs PI_PREFIX EXTENSION_CHECKOUT OUT_DIR
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const [piPrefix, extension, outDir] = process.argv.slice(2).map((p) => path.resolve(p));  // import() needs absolute paths
const core = path.join(piPrefix, "node_modules/@earendil-works/pi-coding-agent/dist/core");
const sm = await import(path.join(core, "session-manager.js"));
const cp = await import(path.join(core, "compaction/compaction.js"));
const { createJiti } = createRequire(path.join(piPrefix, "node_modules/"))("jiti");
const jiti = createJiti(import.meta.url, { alias: { "@earendil-works/pi-coding-agent": path.join(core, "compaction/compaction.js") } });
const progress = await jiti.import(path.join(extension, "src/session-ledger/progress.ts"));

const files = {};
for (const name of fs.readdirSync(outDir).filter((n) => n.endsWith(".export.jsonl"))) {
  const all = sm.parseSessionEntries(fs.readFileSync(path.join(outDir, name), "utf8"));
  sm.migrateSessionEntries(all);
  const entries = all.filter((e) => e.type !== "session");
  const children = new Map();
  for (const e of entries) if (e.parentId) children.set(e.parentId, [...(children.get(e.parentId) ?? []), e]);
  files[all.find((e) => e.type === "session").id] = { byId: new Map(entries.map((e) => [e.id, e])), children };
}

function contextUsage(branch) {
  const projection = sm.buildSessionProjection(branch, branch.at(-1).id);
  const latest = sm.getLatestCompactionEntry(branch);
  if (latest) {  // unknown until an assistant with usage answers after the latest compaction
    const usable = new Set(projection.entries.flatMap((e) => e.messages.some((m) => m.role === "assistant" &&
      m.stopReason !== "aborted" && m.stopReason !== "error" && cp.calculateContextTokens(m.usage) > 0) ? [e.sourceEntry.id] : []));
    const k = branch.findIndex((e) => e.id === latest.id);
    if (!branch.slice(k + 1).some((e) => usable.has(e.id))) return undefined;
  }
  return cp.estimateProjectedContextTokens(projection, branch).tokens;
}

const kinds = { observer: "om.observations.recorded", reflector: "om.reflections.recorded" };
const measures = JSON.parse(fs.readFileSync(path.join(outDir, "measures.json"), "utf8"));
const differ = [];
for (const m of measures) {
  const f = files[m.session];
  let node = f.byId.get(m.entry_id);
  for (let i = 0; i < m.k; i++) node = f.children.get(node.id).find((c) => c.type === "custom" && c.customType.startsWith("om."));
  const branch = [];
  for (let cur = node; cur; cur = cur.parentId ? f.byId.get(cur.parentId) : undefined) branch.push(cur);
  branch.reverse();
  const current = contextUsage(branch);
  const ext = current === undefined ? null : progress.realTokensSinceAnchor(branch, kinds[m.kind], current) ?? null;
  if (ext !== m.om) differ.push({ ...m, extension: ext });
}
console.log(`${differ.length} of ${measures.length} usage-clock values differ from the extension's`);
for (const d of differ.slice(0, 10)) console.log(JSON.stringify(d));
