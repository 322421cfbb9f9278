/**
 * om for a live Pi: compactions from om's memory, and the `recall` tool, answered by om.
 *
 *   pi -e "$(om live info --extension)"        (or list this file under "extensions" in Pi's settings)
 *
 * - session_before_compact: om ingests the session file's new lines and answers with the compaction
 *   at Pi's own cut point (summary and om.folded details, what `om compact` gives on that file). When
 *   om has no memory there, is not installed, fails, or does not answer within `timeoutMs`, the hook
 *   declines and Pi's own summarizer runs; one line says why.
 * - the `recall` tool: the exact evidence behind a memory id, answered by `om live recall`.
 * - with `tick` on, `om run FILE --no-drain` in the background when the agent settles (for teams
 *   without `om serve`); it never blocks a turn.
 * - at session start, one line names om's database and settings.
 *
 * om is asked through the endpoint that serves its database (`om serve` or `om live endpoint`: it
 * announces itself in DB.endpoint.json) when one runs, otherwise through the `om` command. An
 * endpoint file counts only when this user owns it, no one else can read it, and it names a loopback
 * URL, a live pid of this user's and the database om resolves; any other is ignored (the command
 * runs). om finds its database and settings as every om command does in the session's directory
 * (--db/OM_DB, om.toml, Pi's settings); the "om" key of Pi's settings files may override:
 *   {"om": {"enabled": true, "command": "om", "db": "...", "config": "...", "timeoutMs": 5000, "tick": false}}
 * A project's own settings (its .pi/settings.json here, its .pi/settings.json and om.toml for om) count
 * only when Pi trusts the project (ctx.isProjectTrusted()), as Pi's own do: a cloned repository cannot
 * choose the command that runs, the database, or where om sends the session.
 * No imports beyond node's: nothing to install next to this file.
 */
import type { ExtensionAPI, ExtensionContext } from "@earendil-works/pi-coding-agent";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, lstatSync, readFileSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { join, resolve } from "node:path";

type Options = { enabled: boolean; command: string[]; db?: string; config?: string; timeoutMs: number; tick: boolean; trusted: boolean };
type Answer = { result: any; via: string } | { why: string };
type Info = { db: string; db_source: string; settings_files: string[]; endpoint: { url: string } | null };

const DEFAULTS = { enabled: true, command: ["om"], timeoutMs: 5000, tick: false };
const TICK_TIMEOUT_MS = 30 * 60_000;

function settingsFile(path: string): Record<string, unknown> {
	try {
		const section = JSON.parse(readFileSync(path, "utf8"))?.om;
		return section && typeof section === "object" ? section : {};
	} catch {
		return {};
	}
}

/** Whether Pi trusts the session's project (an older Pi that cannot say: not trusted). */
function projectTrusted(ctx: ExtensionContext): boolean {
	try {
		return typeof ctx.isProjectTrusted === "function" && ctx.isProjectTrusted() === true;
	} catch {
		return false;
	}
}

/** The "om" key of Pi's global then, for a trusted project, project settings (read at each use: edits
 * apply at once). */
function readOptions(ctx: ExtensionContext): Options {
	const cwd = ctx.cwd;
	const trusted = projectTrusted(ctx);
	const agentDir = process.env.PI_CODING_AGENT_DIR || join(homedir(), ".pi", "agent");
	const raw = { ...settingsFile(join(agentDir, "settings.json")), ...(trusted ? settingsFile(join(cwd, ".pi", "settings.json")) : {}) };
	const command = typeof raw.command === "string" ? [raw.command] : Array.isArray(raw.command) ? raw.command.map(String) : DEFAULTS.command;
	const timeoutMs = typeof raw.timeoutMs === "number" && raw.timeoutMs > 0 ? raw.timeoutMs : DEFAULTS.timeoutMs;
	return {
		enabled: raw.enabled !== false,
		command: command.length ? command : DEFAULTS.command,
		db: typeof raw.db === "string" ? resolve(cwd, raw.db) : undefined,
		config: typeof raw.config === "string" ? resolve(cwd, raw.config) : undefined,
		timeoutMs,
		tick: raw.tick === true,
		trusted,
	};
}

function seconds(ms: number): string {
	return `${Math.round(ms / 100) / 10} s`;
}

/** Run om in the session's directory; resolves (never rejects) with what happened. */
function runOm(o: Options, cwd: string, args: string[], timeoutMs: number, signal?: AbortSignal,
	started?: (child: ChildProcess) => void, boundMs = timeoutMs): Promise<{ code: number | null; stdout: string; stderr: string; why?: string }> {
	// an untrusted project's own files (.pi/settings.json, om.toml) are not om's settings either
	const global = [...(o.db ? ["--db", o.db] : []), ...(o.config ? ["--config", o.config] : []),
		...(o.trusted ? [] : ["--no-project-settings"])];
	return new Promise((done) => {
		let stdout = "", stderr = "", why: string | undefined;
		const child = spawn(o.command[0], [...o.command.slice(1), ...global, ...args], { cwd, stdio: ["ignore", "pipe", "pipe"] });
		started?.(child);
		let ended = false;
		const finish = (code: number | null, error?: string) => {
			if (ended) return;
			ended = true;
			clearTimeout(timer);
			signal?.removeEventListener("abort", onAbort);
			done({ code, stdout, stderr, why: why ?? error });
		};
		// answer at once: a child of om's may keep the pipes open after om itself is gone
		const stop = (reason: string) => { why ??= reason; child.kill("SIGKILL"); finish(null); };
		const timer = setTimeout(() => stop(`om did not answer within ${seconds(boundMs)}`), timeoutMs);
		const onAbort = () => stop("the compaction was aborted");
		signal?.addEventListener("abort", onAbort, { once: true });
		child.stdout.on("data", (d) => (stdout += d));
		child.stderr.on("data", (d) => (stderr += d));
		child.on("error", (err: NodeJS.ErrnoException) =>
			finish(null, err.code === "ENOENT" ? `om is not installed (no ${o.command[0]} on PATH)` : `cannot run om: ${err.message}`));
		child.on("close", (code) => finish(code));
	});
}

/** om's one-line error (its stderr says `error: …`), or the exit code. */
function failure(r: { code: number | null; stderr: string; why?: string }): string {
	if (r.why) return r.why;
	const line = r.stderr.split("\n").map((l) => l.trim()).filter(Boolean).pop();
	return `om failed: ${line ? line.replace(/^error:\s*/, "") : `exit code ${r.code}`}`;
}

/** The promise's value, or undefined once ``ms`` have passed. */
function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
	let timer: NodeJS.Timeout | undefined;
	const late = new Promise<undefined>((r) => (timer = setTimeout(r, ms)));
	return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** A loopback address written as one (127.x.x.x, [::1]): no name a resolver could send elsewhere. */
function loopbackUrl(url: unknown): boolean {
	try {
		const u = new URL(String(url));
		return u.protocol === "http:" && (/^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(u.hostname) || u.hostname === "[::1]");
	} catch {
		return false;
	}
}

function liveOwnPid(pid: unknown): boolean {
	if (typeof pid !== "number" || !Number.isInteger(pid) || pid <= 0) return false;
	try {
		return statSync(`/proc/${pid}`).uid === process.getuid?.(); // Linux: gone, or another user's
	} catch (err: any) {
		if (err?.code !== "ENOENT" || existsSync("/proc/self")) return false;
	}
	try {
		process.kill(pid, 0); // no /proc: EPERM (another user's process) and ESRCH (gone) both refuse
		return true;
	} catch {
		return false;
	}
}

/** The endpoint serving ``db``, when its announcement is one this user's om wrote: a regular file this
 * user owns and no one else can read, naming a loopback URL, a live pid of this user's and ``db``
 * itself. A file committed to a repository, planted by another user or left by a dead endpoint is
 * ignored: the session's path, leaf and ids are never sent to a server om did not start. */
function endpointOf(db: string | undefined): { url: string; token: string } | undefined {
	if (!db) return undefined;
	const file = `${db}.endpoint.json`;
	try {
		const st = lstatSync(file);
		if (!st.isFile() || (st.mode & 0o077) !== 0 || st.uid !== process.getuid?.()) return undefined;
		const found = JSON.parse(readFileSync(file, "utf8"));
		if (typeof found?.token !== "string" || !loopbackUrl(found?.url) || !liveOwnPid(found?.pid)) return undefined;
		if (typeof found?.db !== "string" || resolve(found.db) !== resolve(db)) return undefined;
		return found;
	} catch {
		return undefined;
	}
}

export default function omMemory(pi: ExtensionAPI) {
	let info: Promise<Info | string> | undefined; // where om's memory is, or why om cannot say
	let tick: ChildProcess | undefined;

	const describe = (o: Options, cwd: string): Promise<Info | string> =>
		runOm(o, cwd, ["live", "info", "--json"], Math.max(o.timeoutMs, 15_000)).then((r) => {
			if (r.code !== 0) return failure(r);
			try {
				return JSON.parse(r.stdout) as Info;
			} catch {
				return "om live info printed no JSON (is om older than this extension?)";
			}
		});

	/** One question to om: the endpoint of its database when one answers, otherwise the om command. */
	async function ask(ctx: ExtensionContext, o: Options, op: "compact" | "recall", payload: Record<string, unknown>,
		cli: string[], signal?: AbortSignal): Promise<Answer> {
		const deadline = Date.now() + o.timeoutMs;
		info ??= describe(o, ctx.cwd);
		const known = o.db ? undefined : await within(info, o.timeoutMs);
		const endpoint = endpointOf(o.db ?? (typeof known === "object" ? known?.db : undefined));
		if (endpoint) {
			try {
				const response = await fetch(`${endpoint.url}/${op}`, {
					method: "POST", body: JSON.stringify(payload),
					headers: { "Content-Type": "application/json", Authorization: `Bearer ${endpoint.token}` },
					signal: AbortSignal.any([AbortSignal.timeout(Math.max(1, deadline - Date.now())), ...(signal ? [signal] : [])]),
				});
				const answer = await response.json();
				return "error" in answer ? { why: `om: ${answer.error}` } : { result: answer.result, via: "the endpoint" };
			} catch (err: any) {
				if (err?.name === "TimeoutError") return { why: `om did not answer within ${seconds(o.timeoutMs)}` };
				if (signal?.aborted) return { why: "the compaction was aborted" };
				// no endpoint answers there (it stopped): the om command still can
			}
		}
		const wait = Math.min(2, o.timeoutMs / 3000).toFixed(1);
		const r = await runOm(o, ctx.cwd, ["live", op, ...cli, "--wait", wait, "--json"], Math.max(1, deadline - Date.now()), signal,
			undefined, o.timeoutMs);
		if (r.code !== 0 || r.why) return { why: failure(r) };
		try {
			return { result: JSON.parse(r.stdout), via: "the om command" };
		} catch {
			return { why: "om printed no JSON" };
		}
	}

	const say = (ctx: ExtensionContext, text: string, level: "info" | "warning" = "info") => {
		if (ctx.hasUI) ctx.ui.notify(text, level);
		else console.error(text);
	};

	pi.on("session_start", async (_event, ctx) => {
		const o = readOptions(ctx);
		if (!o.enabled) return;
		info = describe(o, ctx.cwd);
		void info.then((found) => {
			if (typeof found === "string") return say(ctx, `om: ${found}; compactions use Pi's own summarizer`, "warning");
			const settings = found.settings_files.length ? found.settings_files.join(", ") : "defaults";
			const how = found.endpoint ? `answers from the endpoint ${found.endpoint.url}` : "answers through the om command (start `om live endpoint` for faster answers)";
			say(ctx, `om: memory in ${found.db} (${found.db_source}), settings: ${settings}; ${how}${o.tick ? "; background tick on" : ""}`);
		});
	});

	pi.on("session_before_compact", async (event, ctx) => {
		const o = readOptions(ctx);
		if (!o.enabled) return;
		const file = ctx.sessionManager.getSessionFile();
		if (!file) return say(ctx, "om: this session has no file; Pi's own summarizer runs");
		const leaf = event.branchEntries.at(-1)?.id ?? ctx.sessionManager.getLeafId();
		const { firstKeptEntryId, tokensBefore } = event.preparation;
		const started = performance.now();
		const got = await ask(ctx, o, "compact",
			{ session_file: file, leaf, first_kept_entry_id: firstKeptEntryId, tokens_before: tokensBefore },
			[file, "--leaf", String(leaf), "--first-kept", firstKeptEntryId, "--tokens-before", String(tokensBefore)], event.signal);
		const ms = Math.round(performance.now() - started);
		if ("why" in got) return say(ctx, `${got.why}; Pi's own summarizer runs`, "warning");
		const answer = got.result;
		if (!answer?.compaction) return say(ctx, `om: ${answer?.declined ?? "no answer"}; Pi's own summarizer runs`);
		say(ctx, `om: compacted from memory (${answer.observations} observations, ${answer.reflections} reflections) in ${ms} ms, from ${got.via}`);
		return { compaction: answer.compaction };
	});

	pi.registerTool({
		name: "recall",
		label: "Recall memory evidence",
		description: "Return the exact source messages behind an observation or reflection id of the compacted memory " +
			"(the 12-character id in square brackets), on the current branch. Use it when the exact wording, a path, " +
			"a command or the reason behind a remembered item matters for the next step.",
		promptSnippet: "Use recall(<id>) to read the original messages behind a compacted memory item when precision matters.",
		promptGuidelines: [
			"Use recall with an id shown in the compacted memory before acting on a remembered detail that is unclear.",
			"recall is not a search: it takes one exact 12-character memory id.",
		],
		parameters: {
			type: "object",
			properties: { id: { type: "string", pattern: "^[a-f0-9]{12}$", description: "A 12-character lowercase hex memory id." } },
			required: ["id"],
			additionalProperties: false,
		} as any,
		async execute(_toolCallId: string, params: { id: string }, signal: AbortSignal | undefined, _onUpdate: unknown, ctx: ExtensionContext) {
			const o = readOptions(ctx);
			const file = ctx.sessionManager.getSessionFile();
			const leaf = ctx.sessionManager.getLeafId();
			const got: Answer = !file ? { why: "this session has no file" }
				: await ask(ctx, o, "recall", { session_file: file, leaf, id: params.id },
					[params.id, "--file", file, ...(leaf ? ["--leaf", leaf] : [])], signal);
			if (!("why" in got)) return got.result;
			const message = `The evidence for ${params.id} is unavailable: ${got.why}.`;
			return { content: [{ type: "text", text: message }], details: { status: "source_unavailable", memoryId: params.id, message } };
		},
	} as any);

	pi.on("agent_settled", async (_event, ctx) => {
		const o = readOptions(ctx);
		const file = ctx.sessionManager.getSessionFile();
		if (!o.enabled || !o.tick || !file || tick) return; // one tick at a time; the next settle catches up
		if (ctx.hasUI) ctx.ui.setStatus("om", "om: updating memory…");
		void runOm(o, ctx.cwd, ["run", file, "--no-drain", "--json"], TICK_TIMEOUT_MS, undefined, (child) => (tick = child))
			.then((r) => {
				tick = undefined;
				let line = `om: memory update failed: ${failure(r)}`;
				try {
					const run = JSON.parse(r.stdout);
					const s = run.sessions?.[0];
					if (r.code === 0 || s) line = s ? `om: memory +${s.observations} observations, +${s.reflections} reflections` : "om: memory up to date";
					if (s?.error) line = `om: memory update failed: ${s.error}`;
				} catch {}
				if (ctx.hasUI) ctx.ui.setStatus("om", line);
			});
	});

	pi.on("session_shutdown", async () => {
		tick?.kill("SIGTERM"); // om run stops cleanly; the next tick (or om run) resumes it
	});
}
