// Step 3 of bench/conformance/pi16_sessions.py: Pi 1.6.0's own prepareCompaction on the branch ending at every
// entry of every session file in a directory, for each keepRecentTokens given, as JSON rows
// {session, tip, keep, firstKept, tokensBefore} (null where Pi declines).
// Usage: node bench/conformance/pi16_cut_points.mjs PI_PREFIX SESSIONS_DIR OUT.json 100,400,...
import fs from "node:fs";
import path from "node:path";

const [piPrefix, dir, out] = process.argv.slice(2, 5).map((p) => path.resolve(p));  // import() needs absolute paths
const keeps = process.argv[5];
const core = path.join(piPrefix, "node_modules/@earendil-works/pi-coding-agent/dist/core");
const sm = await import(path.join(core, "session-manager.js"));
const cp = await import(path.join(core, "compaction/compaction.js"));
const rows = [];
for (const name of fs.readdirSync(dir).filter((n) => n.endsWith(".jsonl")).sort()) {
  const all = sm.parseSessionEntries(fs.readFileSync(path.join(dir, name), "utf8"));
  sm.migrateSessionEntries(all);
  const session = all.find((e) => e.type === "session").id;
  const entries = all.filter((e) => e.type !== "session");
  const byId = new Map(entries.map((e) => [e.id, e]));
  for (const tip of entries) {
    const branch = [];
    for (let cur = tip; cur; cur = cur.parentId ? byId.get(cur.parentId) : undefined) branch.push(cur);
    branch.reverse();
    for (const keep of keeps.split(",").map(Number)) {
      const p = cp.prepareCompaction(branch, { enabled: true, reserveTokens: 16384, keepRecentTokens: keep });
      rows.push({ session, tip: tip.id, keep, firstKept: p?.firstKeptEntryId ?? null, tokensBefore: p?.tokensBefore ?? null });
    }
  }
}
fs.writeFileSync(out, JSON.stringify(rows));
