// A stand-in for pi-observational-memory in the real-Pi tests (npm does not serve the real one here;
// PI_OM_EXTENSION names a checkout to use it instead): what it registers that om's extension must see,
// its `recall` tool (at load, as the real one does) and a compaction hook that answers, or declines when
// PI_OTHER_MEMORY_DECLINES is set (as the real one does on a file that holds no ledger of its own).
import { Type } from "typebox";

export const OTHER_SUMMARY = "The other memory extension's summary.";

export default function otherMemory(pi: any) {
	pi.registerTool({
		name: "recall", label: "Recall (other)", description: "The other extension's recall.",
		parameters: Type.Object({ id: Type.String() }),
		async execute() {
			return { content: [{ type: "text", text: "the other extension's evidence" }], details: {} };
		},
	});
	pi.on("session_before_compact", async (event: any) => (process.env.PI_OTHER_MEMORY_DECLINES ? undefined : {
		compaction: { summary: OTHER_SUMMARY, firstKeptEntryId: event.preparation.firstKeptEntryId,
			tokensBefore: event.preparation.tokensBefore, details: { type: "other.memory" } },
	}));
}
