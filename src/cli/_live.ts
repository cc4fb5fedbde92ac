/**
 * What `runlock ls --watch` prints as the locks change, and how it stops:
 * a live table redrawn in place on a terminal, one JSON line per change
 * (`--json`), or one plain line per change; ended by a signal (SIGINT,
 * SIGTERM, SIGHUP) or by a reader that has gone (EPIPE: `| head -n 3`).
 *
 * @module
 */

import { isAbsolute, relative } from "node:path";
import type { LockChange } from "../contract.ts";
import { process } from "../_process.ts";
import { fitTable } from "./_fit.ts";
import {
  agoChangesIn,
  alignRows,
  clock,
  type Info,
  lsCells,
  printable,
  toJson,
} from "./_format.ts";
import type { CliIo } from "./_io.ts";
import { cutEnd } from "./_width.ts";

/** Where the batches of changes go: one of the three forms below. */
export interface Sink {
  /** Shows one batch of changes (the first: the current state). */
  batch(changes: readonly LockChange<Info>[]): void;
  /** Undoes what it did to the terminal, if anything; idempotent. */
  close(): void;
}

/** Whether `err` says that the reader of our output has gone. */
function brokenPipe(err: unknown): boolean {
  const e = err as { code?: string; name?: string };
  return e?.code === "EPIPE" || e?.name === "BrokenPipe";
}

/**
 * `write`, unless the watch has stopped; a reader gone (a synchronous
 * EPIPE, as some runtime may throw) stops it.
 */
function guarded(
  stop: AbortController,
  write: (text: string) => void,
): (text: string) => void {
  return (text) => {
    if (stop.signal.aborted) return;
    try {
      write(text);
    } catch (err) {
      if (!brokenPipe(err)) throw err;
      stop.abort("EPIPE");
    }
  };
}

/**
 * `--json`: one line per change, `{"kind": ..., ...}` with the fields of
 * `ls --json`, each one write, so that a log shipper gets it at once.
 */
export function jsonSink(io: CliIo, stop: AbortController): Sink {
  const out = guarded(stop, io.out);
  return {
    batch(changes) {
      for (const c of changes) {
        out(JSON.stringify({
          kind: c.kind,
          ...toJson({ ...c.inspection, path: c.path }),
        }));
      }
    },
    close() {},
  };
}

/**
 * Not a terminal, no `--json`: one line per change, the kind and then the
 * columns of `runlock ls`. A release's line shows the run that ended, as
 * last seen, not the free lock's empty cells.
 */
export function lineSink(io: CliIo, stop: AbortController): Sink {
  const out = guarded(stop, io.out);
  const last = new Map<string, Info>();
  return {
    batch(changes) {
      const now = Date.now();
      const rows = changes.map((c) => {
        const before = last.get(c.path);
        const shown = c.inspection.state === "free" && before
          ? { ...before, state: "free" as const, path: c.path }
          : { ...c.inspection, path: c.path };
        if (c.inspection.state === "free") last.delete(c.path);
        else last.set(c.path, c.inspection);
        // As wide as their longest, so that separate batches line up too.
        const [state, ...rest] = lsCells(shown, now);
        return [c.kind.padEnd(10), state.padEnd(7), ...rest];
      });
      for (const line of alignRows(rows)) out(line);
    },
    close() {},
  };
}

// The terminal's escape sequences (ECMA-48 and xterm's private modes).
const ALT_SCREEN_ON = "\x1b[?1049h";
const ALT_SCREEN_OFF = "\x1b[?1049l";
const CURSOR_HIDE = "\x1b[?25l";
const CURSOR_SHOW = "\x1b[?25h";
const WRAP_OFF = "\x1b[?7l";
const WRAP_ON = "\x1b[?7h";
const HOME = "\x1b[H";
const CLEAR_SCREEN = "\x1b[2J";
/**
 * Erases a line before it is drawn, not after: a line that fills the width
 * leaves the cursor on its last column, whose character an erase to the
 * end would erase.
 */
const CLEAR_LINE = "\x1b[2K";
const CLEAR_BELOW = "\x1b[J";

/** The column titles but the last: PATH, or NAME for PostgreSQL. */
const HEADER = ["STATE", "PID", "HOST", "SINCE", "COMMAND"];

/**
 * On a narrow terminal the command is cut first, to 8 columns; then the
 * host goes (most rows show the same one), the command, the age, and the
 * pid last (what a person needs to act on a run).
 */
const FIT = { shrink: 4, shrinkMin: 8, drop: [2, 4, 3, 1] };

/** What the table is drawn on. */
interface Screen {
  size(): { columns: number; rows: number };
  write(text: string): void;
}

export const stdoutScreen: Screen = {
  size: () => ({
    columns: process.stdout.columns || 80,
    rows: process.stdout.rows || 24,
  }),
  write: (text) => {
    process.stdout.write(text);
  },
};

/**
 * The live table on a terminal, on the alternate screen (as top and less
 * use it): redrawn in place when a batch changes it, on a resize, and when
 * an age would read otherwise. Lines fit the width, never wrapped (see
 * FIT); rows beyond the height are counted on the last line: "… 3 more".
 */
export class LiveTable implements Sink {
  readonly #screen: Screen;
  readonly #title: string;
  readonly #base: string | undefined;
  readonly #header: string[];
  readonly #rows = new Map<string, Info>();
  #last = "";
  #frame: string | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #on = false;
  #closed = false;
  /** Whether the first batch (what is there) has come. */
  #ready = false;

  /**
   * A table under `title`, which names the last change's path from
   * `options.base` (the watched directory); it takes the screen at once.
   */
  constructor(
    screen: Screen,
    title: string,
    options: { base?: string; key?: "PATH" | "NAME" } = {},
  ) {
    this.#screen = screen;
    this.#title = title;
    this.#base = options.base;
    this.#header = [...HEADER, options.key ?? "PATH"];
    this.resume();
  }

  /** `path` as the title names it: from the watched directory, if under it. */
  #short(path: string): string {
    if (this.#base === undefined) return path;
    const from = relative(this.#base, path);
    return from === "" || from.startsWith("..") || isAbsolute(from)
      ? path
      : from;
  }

  batch(changes: readonly LockChange<Info>[]): void {
    if (this.#closed) return;
    this.#ready = true;
    for (const c of changes) {
      if (c.inspection.state === "free") this.#rows.delete(c.path);
      else this.#rows.set(c.path, { ...c.inspection, path: c.path });
      if (c.kind !== "present") {
        this.#last = `last: ${c.kind} ${printable(this.#short(c.path))} at ${
          clock(new Date(), new Date())
        }`;
      }
    }
    this.draw();
  }

  /** The lines of the table now, at most `height` by `columns`. */
  lines(now: number, columns: number, height: number): string[] {
    if (!this.#ready) {
      return [this.#title, "(looking…)"].slice(0, height)
        .map((l) => cutEnd(l, columns));
    }
    const infos = [...this.#rows.values()].sort((a, b) =>
      a.path < b.path ? -1 : a.path > b.path ? 1 : 0
    );
    const count = `${infos.length} lock${infos.length === 1 ? "" : "s"}`;
    const title = [this.#title, count, this.#last].filter(Boolean)
      .join("  ·  ");
    const cells = [
      this.#header,
      ...infos.map((info) => lsCells(info, now)),
    ];
    const [header, ...rows] = alignRows(fitTable(cells, columns, FIT));
    let lines: string[];
    if (infos.length === 0) {
      lines = [title, header, "(no locks)"].slice(0, height);
    } else if (2 + rows.length <= height) {
      lines = [title, header, ...rows];
    } else if (height === 1) {
      // The title alone: it counts the locks.
      lines = [title];
    } else {
      // The title, the header (if a row follows) and the count of the
      // locks not shown.
      const shown = Math.max(0, height - 3);
      const more = `… ${rows.length - shown} more`;
      lines = shown === 0
        ? [title, more]
        : [title, header, ...rows.slice(0, shown), more];
    }
    return lines.map((line) => cutEnd(line, columns));
  }

  /**
   * Draws the table if it reads otherwise than on screen (or `force`), and
   * sets the timer for the next age that will read otherwise.
   */
  draw(force = false): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (this.#closed || !this.#on) return;
    const now = Date.now();
    const { columns, rows } = this.#screen.size();
    const lines = this.lines(now, Math.max(1, columns), Math.max(1, rows));
    const frame = HOME +
      lines.map((l) => CLEAR_LINE + l).join("\r\n") + CLEAR_BELOW;
    if (force || frame !== this.#frame) {
      this.#screen.write(force ? CLEAR_SCREEN + frame : frame);
      this.#frame = frame;
    }
    let next = Infinity;
    for (const info of this.#rows.values()) {
      if (info.started) {
        next = Math.min(next, agoChangesIn(now - info.started.getTime()));
      }
    }
    // A few ms late rather than early: the age must have turned by then.
    if (next < Infinity) this.#timer = setTimeout(() => this.draw(), next + 5);
  }

  /** Gives the terminal back as it was (for a stop, Ctrl-Z). */
  suspend(): void {
    clearTimeout(this.#timer);
    this.#timer = undefined;
    if (!this.#on) return;
    this.#on = false;
    this.#screen.write(WRAP_ON + CURSOR_SHOW + ALT_SCREEN_OFF);
  }

  /** Takes the terminal again (after a stop) and draws the table. */
  resume(): void {
    if (this.#closed || this.#on) return;
    this.#on = true;
    this.#screen.write(ALT_SCREEN_ON + CURSOR_HIDE + WRAP_OFF);
    this.draw(true);
  }

  close(): void {
    this.suspend();
    this.#closed = true;
  }
}

/**
 * Feeds each batch of `changes` to `sink` until they end or `stop` is
 * aborted: then at once, whatever the source still waits for. An error of
 * the source is thrown, unless `stop` was aborted first.
 */
export async function follow(
  changes: AsyncIterable<LockChange<Info>[]>,
  sink: Sink,
  stop: AbortController,
): Promise<void> {
  const iterator = changes[Symbol.asyncIterator]();
  const stopped = new Promise<"stopped">((resolve) => {
    if (stop.signal.aborted) resolve("stopped");
    stop.signal.addEventListener("abort", () => resolve("stopped"), {
      once: true,
    });
  });
  let finished = false;
  try {
    while (!stop.signal.aborted) {
      const next = iterator.next();
      // Left behind when a stop wins the race: its rejection is no error.
      next.catch(() => {});
      const got = await Promise.race([next, stopped]);
      if (got === "stopped") return;
      if (got.done) {
        finished = true;
        return;
      }
      sink.batch(got.value);
    }
  } catch (err) {
    if (!stop.signal.aborted) throw err;
  } finally {
    if (!finished) iterator.return?.()?.catch(() => {});
  }
}

/**
 * Listens, until the returned function is called, for what ends `ls
 * --watch`: SIGINT, SIGTERM, SIGHUP abort `stop` with their name, a reader
 * of stdout gone with "EPIPE" (an "error" of process.stdout: every runtime
 * ignores SIGPIPE). A `table` is given back on Ctrl-Z and on exit, taken
 * again on SIGCONT, redrawn on SIGWINCH.
 */
export function endings(
  stop: AbortController,
  table: LiveTable | undefined,
  stdout: boolean,
): () => void {
  const undo: (() => void)[] = [];
  const on = (name: string, listener: () => void) => {
    try {
      process.on(name as NodeJS.Signals, listener);
      undo.push(() => process.off(name as NodeJS.Signals, listener));
    } catch {
      // A runtime that refuses a signal leaves it at its default action.
    }
  };
  for (const name of ["SIGINT", "SIGTERM", "SIGHUP"]) {
    on(name, () => {
      if (!stop.signal.aborted) stop.abort(name);
    });
  }
  if (stdout) {
    const onError = (err: unknown) => {
      if (stop.signal.aborted) return;
      stop.abort(brokenPipe(err) ? "EPIPE" : err);
    };
    process.stdout.on("error", onError);
    undo.push(() => process.stdout.off("error", onError));
  }
  if (table) {
    on("SIGTSTP", () => {
      table.suspend();
      process.kill(process.pid, "SIGSTOP");
    });
    on("SIGCONT", () => table.resume());
    on("SIGWINCH", () => table.draw(true));
    const onExit = () => table.close();
    process.on("exit", onExit);
    undo.push(() => process.off("exit", onExit));
  }
  return () => undo.splice(0).forEach((f) => f());
}
