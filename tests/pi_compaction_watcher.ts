// Another extension watching om's pending compactions on Pi's event bus (the real-Pi tests): each
// "om:compaction" event, what "om:compaction:query" answers while one is pending, and what its `done`
// promise resolves to, one JSON line each in $OM_TEST_WATCH_FILE.
import { appendFileSync } from "node:fs";

export default function watcher(pi: any) {
	const note = (what: unknown) => appendFileSync(process.env.OM_TEST_WATCH_FILE as string, JSON.stringify(what) + "\n");
	pi.events.on("om:compaction", (data: any) => {
		const { done, ...seen } = data;
		note({ event: seen });
		if (data.state !== "pending") return;
		pi.events.emit("om:compaction:query", { reply: (pending: any) => note({ query: pending?.firstKeptEntryId ?? null }) });
		done.then((outcome: unknown) => note({ done: outcome }));
	});
}
