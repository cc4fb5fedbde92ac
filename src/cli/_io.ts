/**
 * Where the commands write: {@linkcode CliIo}, the default on stdout and
 * stderr, and the updating "waiting" line on a terminal.
 *
 * @module
 */

import { process } from "../_process.ts";
import { envValue } from "../platform/runtime.ts";
import { wrap } from "./_width.ts";
import {
  clip,
  describeState,
  elapsed,
  type Info,
  printable,
} from "./_format.ts";

/**
 * Where {@linkcode main} writes: one line per call, without the newline.
 *
 * @example Capturing what the command prints
 * ```ts
 * import { type CliIo, main } from "@runlock/runlock/cli";
 * import assert from "node:assert/strict";
 *
 * const out: string[] = [];
 * const io: CliIo = { out: (t) => out.push(t), err: () => {} };
 * assert.equal(await main(["--version"], io), 0);
 * assert.match(out[0], /^runlock \d+\.\d+\.\d+$/);
 * ```
 */
export interface CliIo {
  /** The answer (stdout). */
  out(text: string): void;
  /** Messages and errors (stderr). */
  err(text: string): void;
  /**
   * An updating status line while waiting for a lock (who holds it, what
   * it runs, how long we have waited): each call replaces the previous
   * line, and `""` clears it. Leave it out where nobody watches a terminal;
   * the default has it only when stderr is a terminal.
   */
  status?(line: string): void;
}

/** The width messages on a terminal are broken to: COLUMNS, else 80. */
function columns(): number {
  const given = Number(envValue("COLUMNS"));
  return Number.isInteger(given) && given >= 20 ? given : 80;
}

/** The width of the line `status` last drew, for TERM=dumb. */
let drawn = 0;

/**
 * stdout and stderr, with the waiting line when stderr is a terminal.
 * Messages are broken to fit a terminal; in a log or a pipe each stays
 * whole on its line, for grep.
 */
export const stdio: CliIo = {
  out: (text) => process.stdout.write(text + "\n"),
  err: (text) =>
    process.stderr.write(
      (process.stderr.isTTY ? wrap(text, columns()) : text) + "\n",
    ),
  ...(process.stderr.isTTY ? { status: drawLine } : {}),
};

/**
 * Redraws one line of stderr in place, cut to the terminal's width: a
 * wrapped line is out of a carriage return's reach. TERM=dumb knows no
 * erase sequence: spaces over the rest.
 */
function drawLine(line: string): void {
  const width = Math.max(20, (process.stderr.columns || 80) - 1);
  const text = clip(line, width);
  const dumb = process.env.TERM === "dumb";
  const length = [...text].length;
  process.stderr.write(
    dumb
      ? `\r${text}${" ".repeat(Math.max(0, drawn - length))}${
        line === "" ? "\r" : ""
      }`
      : `\r${text}\x1b[K`,
  );
  drawn = length;
}

/**
 * The "waiting" line on a terminal: redrawn when what it says changes,
 * cleared when the wait ends. Nothing when `io` has no status line.
 */
export class Progress {
  #io: CliIo;
  #start = Date.now();
  #text = "";
  #done = false;

  constructor(io: CliIo) {
    this.#io = io;
  }

  /** Whether there is a line to draw. */
  get enabled(): boolean {
    return this.#io.status !== undefined && !this.#done;
  }

  /** Says who holds the lock now, if that changes the line. */
  update(info: Info): void {
    if (!this.enabled || info.state !== "held") return;
    // The waited time first, no path (the user just typed it): the line
    // is cut to the terminal's width.
    const where = info.host ? ` on ${printable(info.host)}` : "";
    const who = info.pid === 0
      ? describeState(info)
      : info.meta.cmd
      ? `pid ${info.pid}${where} runs ${printable(info.meta.cmd)}`
      : `held by pid ${info.pid}${where}`;
    const text = `runlock: waiting ${
      elapsed(Date.now() - this.#start)
    } for the lock: ${who}`;
    if (text === this.#text) return;
    this.#text = text;
    this.#io.status!(text);
  }

  /** Clears the line for good. */
  done(): void {
    this.#done = true;
    if (this.#text !== "") this.#io.status!("");
    this.#text = "";
  }
}
