// A Pi extension for bench/conformance/pi16_sessions.py: at every agent_start and turn_end (where the TypeScript
// extension measures its clocks) it appends to $PROBE_OUT what Pi's own getContextUsage says and, with
// $PROBE_EXTENSION (a checkout of elpapi42/pi-observational-memory, read from its source, never
// copied), the observer and reflector clocks the extension decides with (realTokensSinceAnchor, or its
// raw source-token fallback) and its dropper and proactive compaction clocks (raw source tokens). A prompt holding "[drop-edit]" or "[add-edit]" changes the tool loadout
// first, so Pi records a new system message as an extension's loadout change makes it do.
import fs from "node:fs";
import path from "node:path";

const KINDS = { observer: "om.observations.recorded", reflector: "om.reflections.recorded" };

export default async function (pi: any) {
	const checkout = process.env.PROBE_EXTENSION;
	const progress = checkout ? await import(path.join(checkout, "src/session-ledger/progress.ts")) : undefined;
	const raw = { observer: "rawTokensSinceObservationCoverage", reflector: "rawTokensSinceReflectionCoverage" };

	const record = (event: string) => (_event: unknown, ctx: any) => {
		const branch = ctx.sessionManager.getBranch();
		const tokens = ctx.getContextUsage?.()?.tokens;
		const context = typeof tokens === "number" && Number.isFinite(tokens) ? tokens : null;
		const row: Record<string, unknown> = { event, session: ctx.sessionManager.getSessionId(), leaf: branch.at(-1)?.id, context };
		if (progress) {
			for (const [clock, kind] of Object.entries(KINDS)) {
				const real = context === null ? undefined : progress.realTokensSinceAnchor(branch, kind, context);
				row[clock] = real ?? progress[raw[clock as keyof typeof raw]](branch);
				row[`${clock}_basis`] = real === undefined ? "source" : "usage";
			}
			row.dropper = progress.rawTokensSinceDropCoverage(branch);  // always on source tokens
			row.compaction = progress.rawTokensSinceLastCompaction(branch);
		}
		fs.appendFileSync(process.env.PROBE_OUT!, JSON.stringify(row) + "\n");
	};

	pi.on("before_agent_start", (event: unknown) => {
		const text = JSON.stringify(event ?? {});
		if (text.includes("[drop-edit]")) pi.setActiveTools(pi.getActiveTools().filter((name: string) => name !== "edit"));
		if (text.includes("[add-edit]")) pi.setActiveTools([...pi.getActiveTools(), "edit"]);
	});
	pi.on("agent_start", record("agent_start"));
	pi.on("turn_end", record("turn_end"));
}
