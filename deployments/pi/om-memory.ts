/**
 * om for a live Pi: compactions from om's memory, and the `recall` tool, answered by om.
 *
 *   pi install "$(om live info --package)"     (every session; this folder is a Pi package)
 *   pi -e "$(om live info --extension)"        (one session)
 *
 * - session_before_compact: om ingests the session file's new lines and answers with the compaction
 *   at Pi's own cut point (summary and om.folded details, what `om compact` gives on that file; Pi's
 *   customInstructions, from `/compact TEXT`, follow the memory). When om's observer is behind Pi's
 *   cut, om catches up (within this hook's deadline) or keeps from the first message its memory does
 *   not cover: its firstKeptEntryId is then an entry before Pi's cut, which Pi writes verbatim; om
 *   declines when that would keep too much or free nothing (Pi's own summarizer runs). The answer is
 *   checked before Pi writes it (a non-empty summary, a firstKeptEntryId at or before Pi's on the
 *   branch, Pi's own tokensBefore, details an object).
 *   When om has no memory there, is not installed, fails, answers something else or does not answer
 *   within `timeoutMs`, the hook declines and Pi's own summarizer runs; one line says why.
 * - the `recall` tool: the exact evidence behind a memory id, answered by om (the extension's text);
 *   or, given a query, the memory and transcript it matches (this session's branch first, then its
 *   project), each with the id to recall next.
 * - commands: /om:status, /om:view [full|replayed], /om:recall ID|QUERY, /om:consolidate (the due
 *   stages now, with the configured model, even when passive); each answers in a notification.
 * - with om's setting `selfCompact` on (om.toml, Pi's "observational-memory" settings, OM_SELF_COMPACT;
 *   read at session start through `om live info`), the `compact_context` tool: the agent asks for a
 *   compaction at a breakpoint it chooses, with a required resume note; once the agent settles Pi
 *   compacts (through the hook above: om's memory, no model call), the call and its note stay in the
 *   kept tail, and a short message starts the next turn pointing the agent at the note. `warnAt` rules
 *   (a share of the window, at most 1, or tokens) ask the agent to compact as its context fills: one
 *   message per rule crossed since the latest compaction, the last one firmer.
 * - with `tick` on, `om run FILE --no-drain` in the background when the agent settles (for teams
 *   without `om serve`); it never blocks a turn. om's setting `passive` (or PI_OBSERVATIONAL_MEMORY_PASSIVE)
 *   stops it (not the commands); with `consolidateWhenIdle` the agent starting a turn stops it (om run
 *   resumes where it was at the next settle).
 * - at session start, one line names om's database and settings (`om live info`, with a deadline of
 *   its own, `infoTimeoutMs`).
 * - with pi-observational-memory also loaded (a `recall` tool of another extension's, or its
 *   /om:status command), its tool and commands are the only ones (om registers none), and om's
 *   compaction hook stays: Pi keeps the answer of the extension loaded last that gives one, so om's
 *   answer stands whenever the other gives none. One line at session start says so; each compaction's
 *   line waits until Pi has written it, so it names the answer Pi kept (the first time the other's
 *   answer replaces om's, one line says that instead).
 *
 * Where om's memory is: the database named in the "om" settings below, else OM_DB, else the
 * database of the endpoint that serves the session's folder (`om serve --live DIR`, `om live
 * endpoint`: they announce themselves in this user's state folder, $XDG_STATE_HOME/om/endpoints or
 * ~/.local/state/om/endpoints), else om's default. A database named that does not exist is one line
 * ("no om database at ..."), and nothing is created. om is asked through that endpoint when one runs
 * (fast), otherwise, or when the endpoint fails, through the `om` command run in the session's folder.
 * An announcement counts only when it is a regular file this user owns and no one else can read,
 * in a folder no one else can write, naming a loopback address, a live process of this user's, and
 * the database om resolves. Requests carry the session's folder, so the endpoint answers with that
 * project's settings, as the om command run there does.
 *
 * The "om" key of Pi's settings files (global, then the project's when Pi trusts the project:
 * ctx.isProjectTrusted(); an untrusted project's own files are not om's settings either) may set:
 *   {"om": {"enabled": true, "command": "om", "db": "...", "config": "...", "timeoutMs": 5000,
 *           "infoTimeoutMs": 15000, "tick": false}}
 *
 * Other extensions see a compaction in progress on Pi's event bus: "om:compaction" carries
 * {state: "pending", sessionFile, firstKeptEntryId, reason, done} when Pi starts one (done: a promise
 * of {compacted, fromExtension, aborted} once Pi has written it or given up) and {state: "finished",
 * ...} after; emitting "om:compaction:query" with {reply(pending)} gets the pending one (or undefined).
 *
 * Imports: node's, and typebox, which Pi supplies to extensions (nothing to install next to this file).
 */
import type {
	AgentToolResult,
	ExtensionAPI,
	ExtensionContext,
	SessionBeforeCompactEvent,
	SessionBeforeCompactResult,
} from "@earendil-works/pi-coding-agent";
import { Type } from "typebox";
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync, lstatSync, readdirSync, readFileSync, realpathSync, statSync } from "node:fs";
import { homedir } from "node:os";
import { isAbsolute, join, resolve, sep } from "node:path";

type Options = {
	enabled: boolean;
	command: string[];
	db?: string; // named by the settings or OM_DB: the database, wherever the session lies
	dbFrom?: string;
	config?: string;
	timeoutMs: number;
	infoTimeoutMs: number;
	tick: boolean;
	trusted: boolean;
};
type Announcement = { url: string; token: string; pid: number; db: string; sessions: string[]; started: number };
type Ran = { code: number | null; stdout: string; stderr: string; why?: string };
type Info = {
	db: string; db_source: string; db_exists: boolean; settings_files: string[]; endpoint: { url: string } | null;
	selfCompact: boolean; warnAt: number[]; // om's settings selfCompact and warnAt, as om resolves them here
	passive: boolean; consolidateWhenIdle: boolean; // likewise (passive also from PI_OBSERVATIONAL_MEMORY_PASSIVE)
};
type Compaction = { summary: string; firstKeptEntryId: string; tokensBefore: number; details: Record<string, unknown> };
type CompactAnswer =
	| { compaction: Compaction; observations: number; reflections: number; via: string; after?: string; moved?: string }
	| { declined: string }
	| { why: string };
type RecallResult = AgentToolResult<unknown>;
type Heard = { line: string; level: "info" | "warning" } & ({ summary: string } | { why: string });
type RecallAsk = { id: string } | { query: string };
type CompactionOutcome = { compacted: boolean; fromExtension: boolean; aborted: boolean };
type PendingCompaction = {
	state: "pending";
	sessionFile: string | undefined;
	firstKeptEntryId: string;
	reason: string;
	done: Promise<CompactionOutcome>;
};

const DEFAULTS = { command: ["om"], timeoutMs: 5000, infoTimeoutMs: 15_000 };
const TICK_TIMEOUT_MS = 30 * 60_000;
const GRACE_MS = 10_000; // after SIGTERM, om run's time to stop its helpers before SIGKILL
const FILE = "\u0000session-file"; // stands for the session's file in a command's arguments
const SELF_COMPACT_TOOL = "compact_context";
const SELF_COMPACT_RESUME = "om.self-compact.resume"; // the message after an agent-asked compaction
const SELF_COMPACT_WARNING = "om.self-compact.warning"; // a warnAt rule's ask

// ------------------------------------------------------------------ settings

function isRecord(value: unknown): value is Record<string, unknown> {
	return typeof value === "object" && value !== null && !Array.isArray(value);
}

function errorCode(err: unknown): string | undefined {
	return isRecord(err) && typeof err.code === "string" ? err.code : undefined;
}

function settingsFile(path: string): Record<string, unknown> {
	try {
		const parsed: unknown = JSON.parse(readFileSync(path, "utf8"));
		return isRecord(parsed) && isRecord(parsed.om) ? parsed.om : {};
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

function positive(value: unknown, fallback: number): number {
	return typeof value === "number" && Number.isFinite(value) && value > 0 ? value : fallback;
}

/** The "om" key of Pi's global then, for a trusted project, project settings (read at each use: edits
 * apply at once). */
function readOptions(ctx: ExtensionContext): Options {
	const cwd = ctx.cwd;
	const trusted = projectTrusted(ctx);
	const agentDir = process.env.PI_CODING_AGENT_DIR || join(homedir(), ".pi", "agent");
	const raw = { ...settingsFile(join(agentDir, "settings.json")), ...(trusted ? settingsFile(join(cwd, ".pi", "settings.json")) : {}) };
	const listed = Array.isArray(raw.command) ? raw.command.filter((part): part is string => typeof part === "string") : [];
	const command = typeof raw.command === "string" ? [raw.command] : listed.length ? listed : DEFAULTS.command;
	const named = typeof raw.db === "string" ? { db: resolve(cwd, raw.db), dbFrom: "the om settings' db" }
		: process.env.OM_DB ? { db: resolve(cwd, process.env.OM_DB), dbFrom: "OM_DB" } : {};
	return {
		enabled: raw.enabled !== false,
		command,
		...named,
		config: typeof raw.config === "string" ? resolve(cwd, raw.config) : undefined,
		timeoutMs: positive(raw.timeoutMs, DEFAULTS.timeoutMs),
		infoTimeoutMs: positive(raw.infoTimeoutMs, DEFAULTS.infoTimeoutMs),
		tick: raw.tick === true,
		trusted,
	};
}

function seconds(ms: number): string {
	return `${Math.round(ms / 100) / 10} s`;
}

// ------------------------------------------------------------------ the endpoints' announcements

function endpointsFolder(): string {
	const state = process.env.XDG_STATE_HOME;
	return join(state && isAbsolute(state) ? state : join(homedir(), ".local", "state"), "om", "endpoints");
}

/** A loopback address written as one (127.x.x.x, [::1]): no name a resolver could send elsewhere. */
function loopbackUrl(url: unknown): url is string {
	try {
		const u = new URL(String(url));
		return u.protocol === "http:" && (/^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(u.hostname) || u.hostname === "[::1]");
	} catch {
		return false;
	}
}

function liveOwnPid(pid: unknown): pid is number {
	if (typeof pid !== "number" || !Number.isInteger(pid) || pid <= 0) return false;
	try {
		return statSync(`/proc/${pid}`).uid === process.getuid?.(); // Linux: gone, or another user's
	} catch (err) {
		if (errorCode(err) !== "ENOENT" || existsSync("/proc/self")) return false;
	}
	try {
		process.kill(pid, 0); // no /proc: EPERM (another user's process) and ESRCH (gone) both refuse
		return true;
	} catch {
		return false;
	}
}

function ownPrivate(path: string, folder: boolean): boolean {
	try {
		const st = lstatSync(path);
		const kind = folder ? st.isDirectory() : st.isFile();
		return kind && st.uid === process.getuid?.() && (st.mode & (folder ? 0o022 : 0o077)) === 0;
	} catch {
		return false;
	}
}

/** An announcement this user's om wrote: a regular file this user owns and no one else can read,
 * naming a loopback URL, a live process of this user's, a database and the folders it serves. A file
 * committed to a repository, planted by another user or left by a dead endpoint is never believed:
 * the session's path, leaf and ids are never sent to a server om did not start. */
function announcement(path: string): Announcement | undefined {
	if (!ownPrivate(path, false)) return undefined;
	try {
		const found: unknown = JSON.parse(readFileSync(path, "utf8"));
		if (!isRecord(found) || typeof found.token !== "string" || !loopbackUrl(found.url) || !liveOwnPid(found.pid)) return undefined;
		if (typeof found.db !== "string" || !isAbsolute(found.db)) return undefined;
		const sessions = Array.isArray(found.sessions) ? found.sessions.filter((s): s is string => typeof s === "string" && isAbsolute(s)) : [];
		const started = typeof found.started === "number" ? found.started : 0;
		return { url: found.url, token: found.token, pid: found.pid, db: found.db, sessions, started };
	} catch {
		return undefined;
	}
}

function realpath(path: string): string {
	try {
		return realpathSync(path);
	} catch {
		return resolve(path);
	}
}

function within(path: string, folder: string): boolean {
	return path === folder || path.startsWith(folder.endsWith(sep) ? folder : folder + sep);
}

/** The running endpoint for this session: the one serving ``db`` when a database is named, else the one
 * whose session folders hold the file (the closest folder, then the latest started), as om itself
 * chooses (flows/endpoint.py). */
function findEndpoint(db: string | undefined, sessionFile: string | undefined): Announcement | undefined {
	const folder = endpointsFolder();
	if (!ownPrivate(folder, true)) return undefined;
	let names: string[];
	try {
		names = readdirSync(folder).filter((n) => n.endsWith(".json")).sort();
	} catch {
		return undefined;
	}
	const file = sessionFile ? realpath(sessionFile) : undefined;
	const wanted = db ? realpath(db) : undefined;
	let best: { depth: number; started: number; found: Announcement } | undefined;
	for (const name of names) {
		const found = announcement(join(folder, name));
		if (!found) continue;
		if (wanted) {
			if (realpath(found.db) === wanted) return found;
			continue;
		}
		if (!file) continue;
		const depths = found.sessions.filter((s) => within(file, s)).map((s) => s.split(sep).filter(Boolean).length);
		if (!depths.length) continue;
		const depth = Math.max(...depths);
		if (!best || depth > best.depth || (depth === best.depth && found.started > best.started)) best = { depth, started: found.started, found };
	}
	return best?.found;
}

// ------------------------------------------------------------------ om as a process

/** The options every om command gets: the database and settings named, and for an untrusted project
 * --no-project-settings (its own .pi/settings.json and om.toml are not om's settings either). */
function globalArgs(o: Options, db: string | undefined): string[] {
	return [...(db ? ["--db", db] : []), ...(o.config ? ["--config", o.config] : []), ...(o.trusted ? [] : ["--no-project-settings"])];
}

/** Stop a child: SIGTERM, then SIGKILL if it is still there after ``graceMs``. Resolves once it is gone
 * (or once the SIGKILL is sent). */
function stopChild(child: ChildProcess, graceMs: number): Promise<void> {
	if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
	return new Promise((done) => {
		const timer = setTimeout(() => {
			child.kill("SIGKILL");
			done();
		}, graceMs);
		child.once("exit", () => {
			clearTimeout(timer);
			done();
		});
		child.kill("SIGTERM");
	});
}

/** Run om in the session's folder; resolves (never rejects) with what happened. At ``timeoutMs`` (or on
 * ``signal``) the answer is given up at once and the child stopped (SIGTERM, then SIGKILL after
 * ``graceMs``). */
function runOm(o: Options, cwd: string, db: string | undefined, args: string[], timeoutMs: number,
	{ signal, started, boundMs = timeoutMs, graceMs = 0, env }: { signal?: AbortSignal; started?: (child: ChildProcess) => void; boundMs?: number; graceMs?: number; env?: Record<string, string> } = {}): Promise<Ran> {
	return new Promise((done) => {
		let stdout = "";
		let stderr = "";
		let why: string | undefined;
		let child: ChildProcess;
		try {
			child = spawn(o.command[0], [...o.command.slice(1), ...globalArgs(o, db), ...args],
				{ cwd, stdio: ["ignore", "pipe", "pipe"], ...(env ? { env: { ...process.env, ...env } } : {}) });
		} catch (err) {
			done({ code: null, stdout, stderr, why: `cannot run om: ${err instanceof Error ? err.message : String(err)}` });
			return;
		}
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
		const stop = (reason: string) => {
			why ??= reason;
			void stopChild(child, graceMs);
			finish(null);
		};
		const timer = setTimeout(() => stop(`om did not answer within ${seconds(boundMs)}`), timeoutMs);
		const onAbort = () => stop("the compaction was aborted");
		signal?.addEventListener("abort", onAbort, { once: true });
		child.stdout?.on("data", (d: Buffer) => (stdout += d));
		child.stderr?.on("data", (d: Buffer) => (stderr += d));
		child.on("error", (err) =>
			finish(null, errorCode(err) === "ENOENT" ? `om is not installed (no ${o.command[0]} on PATH)` : `cannot run om: ${err.message}`));
		child.on("close", (code) => finish(code));
	});
}

/** om's one-line error (its stderr says `error: …`), or the exit code. */
function failure(r: Ran): string {
	if (r.why) return r.why;
	const line = r.stderr.split("\n").map((l) => l.trim()).filter(Boolean).pop();
	return `om failed: ${line ? line.replace(/^error:\s*/, "") : `exit code ${r.code}`}`;
}

function parseJson(text: string): unknown {
	try {
		return JSON.parse(text);
	} catch {
		return undefined;
	}
}

// ------------------------------------------------------------------ answers, checked

/** om's compaction answer, checked before Pi writes it: a non-empty summary and details that are an
 * object, Pi's own tokensBefore, and a firstKeptEntryId that is Pi's cut or an entry of the branch before
 * it (om keeps every message its memory does not cover yet: F moves back, never forward). Pi writes it
 * verbatim. */
function compactAnswer(result: unknown, firstKeptEntryId: string, tokensBefore: number, via: string, branch: string[]): CompactAnswer {
	if (!isRecord(result)) return { why: `${via} answered no object` };
	if (result.compaction === null || result.compaction === undefined) {
		return typeof result.declined === "string" && result.declined ? { declined: result.declined } : { why: `${via} answered neither a compaction nor why not` };
	}
	const c = result.compaction;
	if (!isRecord(c)) return { why: `${via} answered a compaction that is no object` };
	if (typeof c.summary !== "string" || !c.summary.trim()) return { why: `${via} answered an empty summary` };
	const kept = c.firstKeptEntryId;
	const at = typeof kept === "string" ? branch.indexOf(kept) : -1;
	if (kept !== firstKeptEntryId && (at < 0 || at > branch.indexOf(firstKeptEntryId))) {
		return { why: `${via} answered a compaction at ${JSON.stringify(kept)}, not at Pi's cut ${firstKeptEntryId} or before it` };
	}
	if (typeof c.tokensBefore !== "number" || c.tokensBefore !== tokensBefore) return { why: `${via} answered tokensBefore ${JSON.stringify(c.tokensBefore)}, not Pi's ${tokensBefore}` };
	if (!isRecord(c.details)) return { why: `${via} answered details that are no object` };
	const count = (value: unknown) => (typeof value === "number" && Number.isFinite(value) ? value : 0);
	const moved = kept !== firstKeptEntryId ? String(kept) : undefined;
	return {
		compaction: { summary: c.summary, firstKeptEntryId: String(kept), tokensBefore, details: c.details },
		observations: count(result.observations), reflections: count(result.reflections), via, ...(moved ? { moved } : {}),
	};
}

/** om's recall answer, checked: the tool result's shape (text content, details an object). */
function recallAnswer(result: unknown): RecallResult | undefined {
	if (!isRecord(result) || !Array.isArray(result.content) || !result.content.length || !isRecord(result.details)) return undefined;
	const content: RecallResult["content"] = [];
	for (const part of result.content) {
		if (!isRecord(part) || part.type !== "text" || typeof part.text !== "string") return undefined;
		content.push({ type: "text", text: part.text });
	}
	return { content, details: result.details };
}

/** One POST to the endpoint; the answer's ``result``, or why there is none (an HTTP error included). */
async function post(endpoint: Announcement, op: "compact" | "recall", payload: Record<string, unknown>, ms: number,
	signal?: AbortSignal): Promise<{ result: unknown } | { why: string }> {
	try {
		const response = await fetch(`${endpoint.url}/${op}`, {
			method: "POST", body: JSON.stringify(payload),
			headers: { "Content-Type": "application/json", Authorization: `Bearer ${endpoint.token}` },
			signal: AbortSignal.any([AbortSignal.timeout(Math.max(1, ms)), ...(signal ? [signal] : [])]),
		});
		const answer: unknown = parseJson(await response.text());
		const said = isRecord(answer) && typeof answer.error === "string" ? answer.error : undefined;
		if (!response.ok) return { why: `the endpoint answered HTTP ${response.status}${said ? `: ${said}` : ""}` };
		if (said !== undefined) return { why: `the endpoint said: ${said}` };
		return isRecord(answer) && "result" in answer ? { result: answer.result } : { why: "the endpoint answered no result" };
	} catch (err) {
		if (signal?.aborted) return { why: "the compaction was aborted" };
		if (err instanceof Error && err.name === "TimeoutError") return { why: "the endpoint did not answer in time" };
		return { why: `the endpoint is not answering (${err instanceof Error ? err.message : String(err)})` };
	}
}

// ------------------------------------------------------------------ the extension

/** Another memory extension's registrations: pi-observational-memory's recall tool or its commands
 * (``own``: the file om's own registrations come from; those are not another's). */
function otherMemory(pi: ExtensionAPI, own: string | undefined): string | undefined {
	const tool = pi.getAllTools().find((t) => t.name === "recall" && t.sourceInfo.path !== own);
	if (tool) return `a recall tool from ${tool.sourceInfo.path}`;
	const command = pi.getCommands().find((c) => /^om:(status|view)(:\d+)?$/.test(c.name) && c.sourceInfo.path !== own);
	return command ? `its /${command.name} command from ${command.sourceInfo.path}` : undefined;
}

/** What a recall asks: an id (SPEC §6) or a query; a message when it asks neither or both. */
function recallAsk(params: { id?: string; query?: string }): RecallAsk | string {
	const query = typeof params.query === "string" && params.query.trim() ? params.query : undefined;
	if (typeof params.id === "string" && query === undefined) return { id: params.id };
	if (query !== undefined && params.id === undefined) return { query };
	return "Give recall either an id (12 lowercase hex characters) or a query, not both and not neither.";
}

export default function omMemory(pi: ExtensionAPI) {
	let known: Info | undefined; // where om's memory is, as `om live info` said at session start
	let tick: ChildProcess | undefined;
	let pending: PendingCompaction | undefined;
	let settle: ((outcome: CompactionOutcome) => void) | undefined;
	let registered = false;
	let own: string | undefined; // the file om's registrations come from (Pi's sourceInfo.path)
	let beside: string | undefined; // another memory extension loaded too: what om found of it
	let heard: Heard | undefined; // this compaction's line, beside another memory extension
	let otherSaid = false; // the line that the other's answer was kept: once

	const say = (ctx: ExtensionContext, text: string, level: "info" | "warning" = "info") => {
		if (ctx.hasUI) ctx.ui.notify(text, level);
		else console.error(text);
	};

	/** A compaction's line: at once when om is alone; beside another memory extension, once Pi has
	 * written the compaction, to name the answer Pi kept (``om``: om's summary, or why om had none). */
	const report = (ctx: ExtensionContext, line: string, level: "info" | "warning", om: { summary: string } | { why: string }) => {
		if (beside) heard = { line, level, ...om };
		else say(ctx, line, level);
	};

	/** Beside another memory extension: the line of the compaction Pi wrote. om's own line when Pi kept
	 * om's answer or wrote its own summary; the first time Pi kept the other's, one line says so. */
	const reportWritten = (ctx: ExtensionContext, written: { summary?: unknown } | undefined, fromExtension: boolean) => {
		const got = heard;
		heard = undefined;
		if (!beside || !got) return;
		if (!fromExtension || ("summary" in got && written?.summary === got.summary)) return say(ctx, got.line, got.level);
		if (otherSaid) return;
		otherSaid = true;
		say(ctx, "why" in got ? `${got.why}; the other memory extension answered (${beside})`
			: `om: the other memory extension answered (${beside}): it is loaded after om, so its answer replaces om's whenever it gives one`);
	};

	const describe = (o: Options, ctx: ExtensionContext): Promise<Info | string> => {
		const file = ctx.sessionManager.getSessionFile();
		return runOm(o, ctx.cwd, o.db, ["live", "info", "--json", ...(file ? ["--session", file] : [])], o.infoTimeoutMs).then((r) => {
			if (r.code !== 0 || r.why) return failure(r);
			const found = parseJson(r.stdout);
			if (!isRecord(found) || typeof found.db !== "string") return "om live info printed no JSON (is om older than this extension?)";
			known = {
				db: found.db, db_source: String(found.db_source ?? ""), db_exists: found.db_exists !== false,
				settings_files: Array.isArray(found.settings_files) ? found.settings_files.map(String) : [],
				endpoint: isRecord(found.endpoint) && typeof found.endpoint.url === "string" ? { url: found.endpoint.url } : null,
				selfCompact: found.self_compact === true,
				passive: found.passive === true, consolidateWhenIdle: found.consolidate_when_idle === true,
				warnAt: Array.isArray(found.warn_at) ? found.warn_at.filter((v): v is number => typeof v === "number" && Number.isFinite(v) && v > 0) : [],
			};
			return known;
		});
	};

	/** Why om has no memory to answer from before anything runs: a database named (or found) that does
	 * not exist. */
	const missingDatabase = (o: Options, endpoint: Announcement | undefined): string | undefined => {
		if (endpoint) return undefined;
		const db = o.db ?? known?.db;
		if (!db || existsSync(db)) return undefined;
		return `no om database at ${db}${o.dbFrom ? ` (${o.dbFrom})` : known ? ` (${known.db_source})` : ""}`;
	};

	/** The compaction at Pi's cut: the endpoint, then the om command, each answer checked; or why not. */
	async function compactWithOm(event: SessionBeforeCompactEvent, ctx: ExtensionContext, o: Options, file: string): Promise<CompactAnswer> {
		const deadline = Date.now() + o.timeoutMs;
		const leaf = event.branchEntries.at(-1)?.id ?? ctx.sessionManager.getLeafId() ?? "";
		const { firstKeptEntryId, tokensBefore } = event.preparation;
		const branch = event.branchEntries.map((e) => e.id);
		const reason = typeof event.reason === "string" ? event.reason : undefined;
		const instructions = event.customInstructions?.trim() ? event.customInstructions : undefined;
		const endpoint = findEndpoint(o.db, file);
		const missing = missingDatabase(o, endpoint);
		if (missing) return { why: `om: ${missing}` };
		let tried: string | undefined;
		if (endpoint) {
			const got = await post(endpoint, "compact", {
				session_file: file, leaf, first_kept_entry_id: firstKeptEntryId, tokens_before: tokensBefore,
				cwd: ctx.cwd, project_settings: o.trusted, ...(instructions ? { custom_instructions: instructions } : {}),
				...(reason ? { reason } : {}), deadline_seconds: Math.max(0.1, (deadline - Date.now()) / 1000),
			}, deadline - Date.now(), event.signal);
			if ("result" in got) {
				const checked = compactAnswer(got.result, firstKeptEntryId, tokensBefore, "the endpoint", branch);
				if (!("why" in checked)) return checked;
				tried = checked.why;
			} else {
				if (event.signal.aborted) return { why: got.why };
				tried = got.why;
			}
			if (Date.now() >= deadline) return { why: `om did not answer within ${seconds(o.timeoutMs)} (${tried})` };
		}
		const wait = Math.min(2, o.timeoutMs / 3000).toFixed(1);
		const r = await runOm(o, ctx.cwd, o.db ?? endpoint?.db ?? known?.db,
			["live", "compact", file, "--leaf", leaf, "--first-kept", firstKeptEntryId, "--tokens-before", String(tokensBefore),
				...(instructions ? ["--instructions", instructions] : []), ...(reason ? ["--reason", reason] : []),
				"--deadline", Math.max(0.1, (deadline - Date.now()) / 1000).toFixed(1), "--wait", wait, "--no-endpoint", "--json"],
			Math.max(1, deadline - Date.now()), { signal: event.signal, boundMs: o.timeoutMs });
		const then = tried ? ` (before it, ${tried})` : "";
		if (r.code !== 0 || r.why) return { why: `${failure(r)}${then}` };
		const checked = compactAnswer(parseJson(r.stdout), firstKeptEntryId, tokensBefore, "the om command", branch);
		if ("why" in checked) return { why: `om: ${checked.why}${then}` };
		return "compaction" in checked && tried ? { ...checked, after: tried } : checked;
	}

	async function recallWithOm(ctx: ExtensionContext, o: Options, file: string, asked: RecallAsk, signal: AbortSignal | undefined): Promise<RecallResult | string> {
		const deadline = Date.now() + o.timeoutMs;
		const leaf = ctx.sessionManager.getLeafId();
		const endpoint = findEndpoint(o.db, file);
		const missing = missingDatabase(o, endpoint);
		if (missing) return missing;
		let tried: string | undefined;
		if (endpoint) {
			const got = await post(endpoint, "recall", { session_file: file, leaf, ...asked }, deadline - Date.now(), signal);
			const checked = "result" in got ? recallAnswer(got.result) : undefined;
			if (checked) return checked;
			tried = "why" in got ? got.why : "the endpoint answered no recall result";
		}
		const wait = Math.min(2, o.timeoutMs / 3000).toFixed(1);
		const what = "id" in asked ? [asked.id] : ["--query", asked.query];
		const r = await runOm(o, ctx.cwd, o.db ?? endpoint?.db ?? known?.db, ["live", "recall", ...what, "--file", file, ...(leaf ? ["--leaf", leaf] : []), "--wait", wait, "--json"],
			Math.max(1, deadline - Date.now()), { signal, boundMs: o.timeoutMs });
		const then = tried ? ` (before it, ${tried})` : "";
		if (r.code !== 0 || r.why) return `${failure(r)}${then}`;
		return recallAnswer(parseJson(r.stdout)) ?? `om printed no recall result${then}`;
	}

	const finished = (outcome: CompactionOutcome) => {
		if (!pending) return;
		const { sessionFile, firstKeptEntryId, reason } = pending;
		pending = undefined;
		settle?.(outcome);
		settle = undefined;
		pi.events.emit("om:compaction", { state: "finished", sessionFile, firstKeptEntryId, reason, ...outcome });
	};

	// ---------------------------------------------------------------- commands inside Pi
	// /om:status, /om:view, /om:recall, /om:consolidate: each answers in one notification, through the
	// om command run in the session's folder (the file's new lines ingested first), and says so when om
	// cannot be reached. Explicit commands run even when `passive` is set (SPEC §13).

	/** om's answer for this session's file, after ingesting its new lines; or why there is none. */
	async function omAbout(ctx: ExtensionContext, args: string[], timeoutMs: number, env?: Record<string, string>): Promise<{ text: string } | { why: string }> {
		const o = readOptions(ctx);
		const file = ctx.sessionManager.getSessionFile();
		if (!file) return { why: "this session has no file" };
		const endpoint = findEndpoint(o.db, file);
		const missing = missingDatabase(o, endpoint);
		if (missing) return { why: missing };
		const db = o.db ?? endpoint?.db ?? known?.db;
		const ingested = await runOm(o, ctx.cwd, db, ["ingest", file, "--json"], timeoutMs, { env });
		if (ingested.code !== 0 || ingested.why) return { why: failure(ingested) };
		const r = await runOm(o, ctx.cwd, db, args.map((a) => (a === FILE ? file : a)), timeoutMs, { env });
		if (r.why || (r.code !== 0 && !r.stdout.trim())) return { why: failure(r) };
		return { text: r.stdout.trim() || "(nothing)" };
	}

	function answer(ctx: ExtensionContext, title: string, got: { text: string } | { why: string }): void {
		if ("why" in got) say(ctx, `om is unreachable for ${title}: ${got.why}`, "warning");
		else say(ctx, `${title}\n${got.text}`);
	}

	function registerCommands(): void {
		pi.registerCommand("om:status", {
			description: "om: this session's memory: counts, clocks, visible vs full, drift, the last run",
			handler: async (_args, ctx) => {
				answer(ctx, "om status", await omAbout(ctx, ["status", FILE], readOptions(ctx).infoTimeoutMs));
			},
		});
		pi.registerCommand("om:view", {
			description: "om: this session's memory as the agent sees it, or full / replayed",
			getArgumentCompletions: (prefix: string) => ["full", "replayed"].filter((v) => v.startsWith(prefix)).map((v) => ({ value: v, label: v })),
			handler: async (args, ctx) => {
				const which = args.trim();
				if (which && which !== "full" && which !== "replayed") return say(ctx, "om: /om:view takes nothing, full or replayed", "warning");
				const flag = which === "full" ? ["--full"] : which === "replayed" ? ["--replayed"] : [];
				answer(ctx, `om memory (${which || "visible"})`, await omAbout(ctx, ["view", FILE, ...flag], readOptions(ctx).infoTimeoutMs));
			},
		});
		pi.registerCommand("om:recall", {
			description: "om: the evidence behind a memory id, or what memory and transcript match a query",
			handler: async (args, ctx) => {
				const text = args.trim();
				if (!text) return say(ctx, "om: /om:recall takes a memory id or a query", "warning");
				const o = readOptions(ctx);
				const file = ctx.sessionManager.getSessionFile();
				const asked: RecallAsk = /^[a-f0-9]{12}$/.test(text) ? { id: text } : { query: text };
				const got = !file ? "this session has no file" : await recallWithOm(ctx, o, file, asked, undefined);
				if (typeof got === "string") return say(ctx, `om is unreachable for recall: ${got}`, "warning");
				say(ctx, got.content.map((part) => (part.type === "text" ? part.text : "")).join("\n"));
			},
		});
		pi.registerCommand("om:consolidate", {
			description: "om: run the due memory stages on this session now, with the configured model",
			handler: async (_args, ctx) => {
				if (ctx.hasUI) ctx.ui.setStatus("om", "om: consolidating memory…");
				// an explicit command: `passive` stops scheduled work only
				const got = await omAbout(ctx, ["run", FILE, "--json"], TICK_TIMEOUT_MS, { OM_PASSIVE: "false" });
				if (ctx.hasUI) ctx.ui.setStatus("om", undefined);
				if ("why" in got) return answer(ctx, "om consolidate", got);
				const run = parseJson(got.text);
				const s = isRecord(run) && Array.isArray(run.sessions) && isRecord(run.sessions[0]) ? run.sessions[0] : undefined;
				const failed = s && typeof s.error === "string" && s.error ? s.error : undefined;
				if (failed) return say(ctx, `om consolidate: failed: ${failed}`, "warning");
				say(ctx, s ? `om consolidate: +${s.observations} observations, +${s.reflections} reflections` : "om consolidate: memory up to date");
			},
		});
	}

	function register(): void {
		pi.on("session_before_compact", async (event, ctx): Promise<SessionBeforeCompactResult | undefined> => {
			const o = readOptions(ctx);
			if (!o.enabled) return undefined;
			const file = ctx.sessionManager.getSessionFile();
			finished({ compacted: false, fromExtension: false, aborted: true }); // one Pi never finished
			const done = new Promise<CompactionOutcome>((r) => (settle = r));
			pending = { state: "pending", sessionFile: file, firstKeptEntryId: event.preparation.firstKeptEntryId, reason: event.reason, done };
			pi.events.emit("om:compaction", pending);
			if (!file) {
				report(ctx, "om: this session has no file; Pi's own summarizer runs", "info", { why: "om: this session has no file" });
				return undefined;
			}
			const started = performance.now();
			const got = await compactWithOm(event, ctx, o, file);
			const ms = Math.round(performance.now() - started);
			if ("why" in got) {
				report(ctx, `${got.why}; Pi's own summarizer runs`, "warning", { why: got.why });
				return undefined;
			}
			if ("declined" in got) {
				report(ctx, `om: ${got.declined}; Pi's own summarizer runs`, "info", { why: `om: ${got.declined}` });
				return undefined;
			}
			const after = got.after ? ` (before it, ${got.after})` : "";
			const kept = got.moved ? `; kept from ${got.moved}, before Pi's cut, so no message is lost` : "";
			report(ctx, `om: compacted from memory (${got.observations} observations, ${got.reflections} reflections) in ${ms} ms, from ${got.via}${after}${kept}`, "info", { summary: got.compaction.summary });
			return { compaction: got.compaction };
		});

		pi.on("session_compact", async (event, ctx) => {
			reportWritten(ctx, event.compactionEntry, event.fromExtension);
			finished({ compacted: true, fromExtension: event.fromExtension, aborted: false });
		});
		pi.on("session_compact_failed", async (event, ctx) => {
			reportWritten(ctx, undefined, false);
			finished({ compacted: false, fromExtension: event.fromExtension, aborted: event.aborted });
		});
		pi.events.on("om:compaction:query", (data) => {
			if (isRecord(data) && typeof data.reply === "function") data.reply(pending);
		});

		if (!beside) registerAgentSide();
	}

	/** The recall tool and the commands: not beside another memory extension, whose own are the ones. */
	function registerAgentSide(): void {
		pi.registerTool({
			name: "recall",
			label: "Recall memory evidence",
			description: "Return the exact source messages behind an observation or reflection id of the compacted memory " +
				"(the 12-character id in square brackets), on the current branch; or, given a query instead, the memory and " +
				"transcript it matches, this session's first, then its project's, each with the id to recall next. Use it " +
				"when the exact wording, a path, a command or the reason behind a remembered item matters for the next step.",
			promptSnippet: "Use recall(id) to read the original messages behind a compacted memory item, or recall(query) to search memory and the compacted transcript.",
			promptGuidelines: [
				"Use recall with an id shown in the compacted memory before acting on a remembered detail that is unclear.",
				"Use recall with a query (words, a path, an error) to find what earlier work said when no id is at hand.",
				"Give recall either an id or a query, not both.",
			],
			parameters: Type.Object({
				id: Type.Optional(Type.String({ pattern: "^[a-f0-9]{12}$", description: "A 12-character lowercase hex memory id." })),
				query: Type.Optional(Type.String({ minLength: 1, maxLength: 2000, description: "Words to search memory and the transcript for." })),
			}, { additionalProperties: false }),
			async execute(_toolCallId, params, signal, _onUpdate, ctx): Promise<RecallResult> {
				const o = readOptions(ctx);
				const file = ctx.sessionManager.getSessionFile();
				const asked = recallAsk(params);
				if (typeof asked === "string") {
					return { content: [{ type: "text", text: asked }], details: { status: "invalid_request", message: asked } };
				}
				const label = "id" in asked ? asked.id : JSON.stringify(asked.query);
				const got = !file ? "this session has no file" : await recallWithOm(ctx, o, file, asked, signal);
				if (typeof got !== "string") return got;
				const message = `The evidence for ${label} is unavailable: ${got}.`;
				const what = "id" in asked ? { memoryId: asked.id } : { query: asked.query };
				return { content: [{ type: "text", text: message }], details: { status: "source_unavailable", ...what, message } };
			},
		});

		registerCommands();
	}

	// ---------------------------------------------------------------- compact_context and warnAt
	// The agent compacts at a breakpoint it chooses: the tool only records the request (and ends the
	// run); the compaction starts once the agent settles, so it never cuts a turn in half, and goes
	// through Pi's own path, hence through om's hook. The note is an argument of the call, so it is in
	// the kept tail (the newest entries) and needs no copy; only a failure repeats it.

	let selfCompactOn = false;
	let selfCompactAsked: { resume: string } | undefined;
	let selfCompacting = false;
	let warnedLevel = 0; // warnAt rules already asked about since the latest compaction

	function resumeMessage(resume: string, failure?: string): void {
		const content = failure
			? `The compaction you asked for did not happen (${failure}). Carry on from your resume note:\n\n${resume}`
			: `Your context was compacted into memory. Your ${SELF_COMPACT_TOOL} call just above holds your resume note: carry on from it.`;
		pi.sendMessage({ customType: SELF_COMPACT_RESUME, content, display: true }, { triggerTurn: true, deliverAs: "followUp" });
	}

	function registerSelfCompact(): void {
		if (selfCompactOn) return;
		if (pi.getAllTools().some((t) => t.name === SELF_COMPACT_TOOL)) return; // another extension's: it answers
		selfCompactOn = true;
		pi.registerTool({
			name: SELF_COMPACT_TOOL,
			label: "Compact context",
			description: "Compact the conversation into memory now, at a clean breakpoint of your choosing; the latest turns " +
				"stay word for word. Give a resume note: the task in hand and the next step. Ends this run; the compaction " +
				"follows and a message then brings you back to the note.",
			promptSnippet: "Use compact_context(resume) at a clean breakpoint when the context is filling up.",
			promptGuidelines: [
				"Call compact_context between steps (not in the middle of an edit), with a resume note that says what you are doing and what comes next.",
			],
			parameters: Type.Object({
				resume: Type.String({ minLength: 1, maxLength: 8000, description: "The task in hand and the next step, kept in context after the compaction." }),
			}, { additionalProperties: false }),
			async execute(_toolCallId, params): Promise<AgentToolResult<unknown>> {
				const resume = typeof params.resume === "string" ? params.resume.trim() : "";
				if (!resume) {
					return { content: [{ type: "text", text: "compact_context needs a resume note: the task in hand and the next step." }], details: { scheduled: false } };
				}
				const scheduled = selfCompactAsked === undefined && !selfCompacting;
				if (scheduled) selfCompactAsked = { resume };
				return {
					content: [{ type: "text", text: scheduled ? "Compaction scheduled: it runs when this run ends." : "A compaction is already scheduled." }],
					details: { scheduled }, terminate: true,
				};
			},
		});

		pi.on("agent_settled", async (_event, ctx) => {
			const asked = selfCompactAsked;
			if (!asked) return;
			selfCompactAsked = undefined;
			selfCompacting = true;
			const done = (failure?: string) => {
				selfCompacting = false;
				resumeMessage(asked.resume, failure);
			};
			try {
				ctx.compact({ onComplete: () => done(), onError: (error) => done(error.message) });
			} catch (error) {
				done(error instanceof Error ? error.message : String(error));
			}
		});

		pi.on("turn_end", async (event, ctx) => {
			const rules = known?.warnAt ?? [];
			if (!rules.length || selfCompactAsked || selfCompacting) return;
			const usage = ctx.getContextUsage();
			if (!usage || usage.tokens === null || usage.tokens === undefined) return;
			const tokens = usage.tokens;
			const window = usage.contextWindow;
			// a share of an unknown window never fires
			const thresholds = rules.map((r) => (r <= 1 ? (window > 0 ? r * window : Infinity) : r)).sort((a, b) => a - b);
			const level = thresholds.filter((t) => tokens >= t).length;
			if (level <= warnedLevel) return;
			warnedLevel = level;
			const used = window > 0 ? `${Math.round((tokens / window) * 100)}% of the context window (${tokens} of ${window} tokens)` : `${tokens} tokens of context`;
			const ask = level === thresholds.length ? "Call compact_context before you start anything new."
				: "Call compact_context at the next clean breakpoint.";
			// a turn with no tool results ends the run: the ask then waits for the next prompt
			pi.sendMessage({ customType: SELF_COMPACT_WARNING, content: `You have used ${used}. ${ask}`, display: true, details: { level } },
				{ deliverAs: event.toolResults.length > 0 ? "steer" : "nextTurn" });
		});

		pi.on("session_compact", async () => {
			warnedLevel = 0;
		});
	}

	/** The background tick, its pause while the agent works (consolidateWhenIdle) and its stop at shutdown. */
	function registerTick(): void {
		let paused = false; // the tick was stopped because the agent started a turn

		pi.on("agent_start", async () => {
			if (!tick || !known?.consolidateWhenIdle) return;
			paused = true;
			await stopChild(tick, GRACE_MS);
		});

		pi.on("agent_settled", async (_event, ctx) => {
			const o = readOptions(ctx);
			const file = ctx.sessionManager.getSessionFile();
			if (!o.enabled || !o.tick || !file || tick) return; // one tick at a time; the next settle catches up
			if (known?.passive) {
				if (ctx.hasUI) ctx.ui.setStatus("om", "om: passive: no background memory work (/om:consolidate runs it)");
				return;
			}
			paused = false;
			if (ctx.hasUI) ctx.ui.setStatus("om", "om: updating memory…");
			void runOm(o, ctx.cwd, o.db ?? findEndpoint(undefined, file)?.db, ["run", file, "--no-drain", "--json"], TICK_TIMEOUT_MS,
				{ started: (child) => (tick = child), graceMs: GRACE_MS })
				.then((r) => {
					tick = undefined;
					let line = `om: memory update failed: ${failure(r)}`;
					const run = parseJson(r.stdout);
					const s = isRecord(run) && Array.isArray(run.sessions) && isRecord(run.sessions[0]) ? run.sessions[0] : undefined;
					if (r.code === 0 || s) line = s ? `om: memory +${s.observations} observations, +${s.reflections} reflections` : "om: memory up to date";
					if (s && typeof s.error === "string" && s.error) line = `om: memory update failed: ${s.error}`;
					if (paused) line = "om: memory update paused while the agent works; the next settle resumes it";
					paused = false;
					if (ctx.hasUI) ctx.ui.setStatus("om", line);
				});
		});

		pi.on("session_shutdown", async () => {
			// om run stops cleanly on SIGTERM (the next tick, or om run, resumes it); SIGKILL after the grace
			if (tick) await stopChild(tick, GRACE_MS);
		});
	}

	pi.on("session_start", async (_event, ctx) => {
		if (!registered) {
			beside = otherMemory(pi, own);
			register(); // once per load: a session_start of a new, resumed or forked session too
			registerTick();
			own = pi.getAllTools().find((t) => t.name === "recall" && !beside)?.sourceInfo.path;
		}
		registered = true;
		const o = readOptions(ctx);
		if (!o.enabled) return;
		if (beside) {
			say(ctx, `om: another memory extension is loaded (${beside}): its recall tool and commands are the ones in this session; ` +
				"for compactions Pi keeps the answer of the one loaded last that gives one, so om's stands whenever the other gives none");
		}
		void describe(o, ctx).then((found) => {
			if (typeof found === "string") return say(ctx, `om: ${found}; compactions use Pi's own summarizer`, "warning");
			if (!found.db_exists && !found.endpoint) {
				return say(ctx, `om: no om database at ${found.db} (${found.db_source}); compactions use Pi's own summarizer until om serve or om ingest makes one`, "warning");
			}
			if (found.selfCompact && !beside) registerSelfCompact();
			const settings = found.settings_files.length ? found.settings_files.join(", ") : "defaults";
			const how = found.endpoint ? `answers from the endpoint ${found.endpoint.url}` : "answers through the om command (start `om live endpoint` for faster answers)";
			say(ctx, `om: memory in ${found.db} (${found.db_source}), settings: ${settings}; ${how}${o.tick ? "; background tick on" : ""}`);
		});
	});
}
